//! Fuzzes the DHCP server's packet logic with arbitrary datagrams from the guest.
//! Run from `netsetup/`: `cargo +nightly fuzz run dhcp_answer -- -max_total_time=120`.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use netsetup::dhcp::{DhcpConfig, answer};
use netsetup::resolv::ResolvConf;

fn config() -> &'static DhcpConfig {
    static CONFIG: OnceLock<DhcpConfig> = OnceLock::new();
    CONFIG.get_or_init(|| {
        let resolv = ResolvConf::parse("search ns.svc.cluster.local cluster.local\nnameserver 10.96.0.10\n");
        DhcpConfig::masquerade("10.0.2.0/24".parse().unwrap(), &resolv, Some("vm".into()), None, 1500)
            .expect("fixed config is valid")
    })
}

fuzz_target!(|data: &[u8]| {
    let _ = answer(data, config());
});
