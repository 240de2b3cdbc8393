//! The benchmarks' settings from the environment: numbers and case lists.

/// `key` as a number; `default` when unset. A value that is set but is not a
/// number stops the benchmark rather than running it with the default.
pub fn number(key: &str, default: u64) -> u64 {
    match std::env::var(key) {
        Ok(value) => value
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{key}={value:?} is not a number")),
        Err(_) => default,
    }
}

/// The comma-separated cases in `key` (`default` when unset), each of the
/// colon-separated fields `shape` names (`op:pattern:KiB`), turned into a
/// case by `parse`, which is given the case's text (for its messages) and its
/// fields.
pub fn cases<T>(
    key: &str,
    default: &str,
    shape: &str,
    parse: impl Fn(&str, &[&str]) -> T,
) -> Vec<T> {
    let fields = shape.split(':').count();
    std::env::var(key)
        .unwrap_or_else(|_| default.into())
        .split(',')
        .map(|case| {
            let parts: Vec<&str> = case.split(':').collect();
            assert_eq!(parts.len(), fields, "{key}: case {case:?} is {shape}");
            parse(case, &parts)
        })
        .collect()
}
