//! The DHCP answer function on random and mutated packets: never a panic, and every reply
//! it does produce is a well-formed BOOTREPLY for the same transaction. Deterministic (fixed
//! seed) so CI runs the same cases as the fuzz target's entry point without nightly.

use dhcproto::v4::{DhcpOption, Message, MessageType, Opcode};
use dhcproto::{Decodable, Decoder, Encodable};
use netsetup::dhcp::{DhcpConfig, answer};
use netsetup::resolv::ResolvConf;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

fn config() -> DhcpConfig {
    let resolv =
        ResolvConf::parse("search ns.svc.cluster.local cluster.local\nnameserver 10.96.0.10\n");
    DhcpConfig::masquerade(
        "10.0.2.0/24".parse().unwrap(),
        &resolv,
        Some("vm".into()),
        None,
        1500,
    )
    .unwrap()
}

fn check(bytes: &[u8], cfg: &DhcpConfig) -> bool {
    match answer(bytes, cfg) {
        Ok(Some(reply)) => {
            let reply = Message::decode(&mut Decoder::new(&reply)).expect("our reply decodes");
            assert_eq!(reply.opcode(), Opcode::BootReply);
            // The transaction id is bytes 4..8 of any request that got an answer.
            let xid = u32::from_be_bytes(bytes[4..8].try_into().unwrap());
            assert_eq!(reply.xid(), xid);
            true
        }
        Ok(None) | Err(_) => false,
    }
}

#[test]
fn random_bytes_never_panic() {
    let cfg = config();
    let mut rng = StdRng::seed_from_u64(0x6b36_7400);
    for _ in 0..20_000 {
        let len = rng.random_range(0..600);
        let bytes: Vec<u8> = (0..len).map(|_| rng.random()).collect();
        check(&bytes, &cfg);
    }
}

#[test]
fn mutated_requests_never_panic_and_some_are_answered() {
    let cfg = config();
    let mut rng = StdRng::seed_from_u64(42);
    let mut seeds = Vec::new();
    for kind in [
        MessageType::Discover,
        MessageType::Request,
        MessageType::Release,
    ] {
        let mut msg = Message::default();
        msg.set_chaddr(&[0x52, 0x54, 0, 1, 2, 3]);
        msg.opts_mut().insert(DhcpOption::MessageType(kind));
        msg.opts_mut()
            .insert(DhcpOption::RequestedIpAddress([10, 0, 2, 2].into()));
        seeds.push(msg.to_vec().unwrap());
    }
    let mut answered = 0;
    for i in 0..20_000 {
        let mut bytes = seeds[i % seeds.len()].clone();
        for _ in 0..rng.random_range(1..8) {
            match rng.random_range(0..3) {
                0 if !bytes.is_empty() => {
                    let at = rng.random_range(0..bytes.len());
                    bytes[at] = rng.random();
                }
                1 if !bytes.is_empty() => {
                    let at = rng.random_range(0..bytes.len());
                    bytes.truncate(at);
                }
                _ => {
                    let extra: Vec<u8> =
                        (0..rng.random_range(1..16)).map(|_| rng.random()).collect();
                    bytes.extend(extra);
                }
            }
        }
        if check(&bytes, &cfg) {
            answered += 1;
        }
    }
    // Mutations in the options area often keep the request valid: the answering path ran.
    assert!(
        answered > 100,
        "only {answered} mutated requests were answered"
    );
}
