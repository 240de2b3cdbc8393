//! Domain JSON from launchers (GetDomain, domain events): parsing must never
//! panic, and what parses must round-trip.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(domain) = proto::domain::Domain::from_json(text) {
        let again = proto::domain::Domain::from_json(&domain.to_json()).expect("round trip");
        assert_eq!(again.to_json(), domain.to_json());
    }
});
