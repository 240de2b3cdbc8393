//! Test support (the `testing` feature only): a `tracing` subscriber that
//! keeps every line, so a test can count the lines a guest made a device log.

use std::sync::Mutex;

/// Keeps the text of every event, for tests that count the lines a guest
/// caused. Device threads log to the global default, so tests of the whole
/// device use [`LogCapture::global`] and look for their own messages.
#[derive(Clone, Default)]
pub struct LogCapture(std::sync::Arc<Mutex<Vec<String>>>);

impl LogCapture {
    /// The process's global subscriber, installed on first use.
    pub fn global() -> &'static LogCapture {
        static GLOBAL: std::sync::OnceLock<LogCapture> = std::sync::OnceLock::new();
        GLOBAL.get_or_init(|| {
            let capture = LogCapture::default();
            // Fails only if another global subscriber was installed first.
            let _ = tracing::subscriber::set_global_default(capture.clone());
            capture
        })
    }

    /// The lines so far that contain `needle`.
    pub fn lines_with(&self, needle: &str) -> Vec<String> {
        let lines = self.0.lock().unwrap_or_else(|p| p.into_inner());
        lines
            .iter()
            .filter(|l| l.contains(needle))
            .cloned()
            .collect()
    }
}

impl tracing::Subscriber for LogCapture {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        struct Text(String);
        impl tracing::field::Visit for Text {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                use std::fmt::Write;
                let _ = write!(self.0, " {}={value:?}", field.name());
            }
        }
        let mut text = Text(format!(
            "[{}] {} {}:",
            std::thread::current().name().unwrap_or("?"),
            event.metadata().level(),
            event.metadata().target()
        ));
        event.record(&mut text);
        self.0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(text.0);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}
