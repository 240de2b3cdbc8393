//! The fuzz targets' entry points on deterministic random inputs, so CI
//! runs them without a nightly toolchain.

use block::fuzz_support::{concurrent_ops_input, header_input, ops_input};
use block::qcow2::{CreateOptions, create};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

#[test]
fn header_parser_survives_mutated_headers() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = StdRng::seed_from_u64(42);
    let mut seeds = Vec::new();
    for (i, cs) in [512u64, 4096, 65536].into_iter().enumerate() {
        let p = dir.path().join(format!("seed{i}.qcow2"));
        create(
            &p,
            &CreateOptions {
                size: Some(4 << 20),
                cluster_size: cs,
                ..Default::default()
            },
        )
        .unwrap();
        seeds.push(std::fs::read(&p).unwrap());
    }
    for round in 0..400 {
        let mut data = seeds[round % seeds.len()].clone();
        let flips = rng.random_range(1..8);
        for _ in 0..flips {
            // Mostly the header fields, sometimes the tables.
            let limit = if rng.random_bool(0.8) {
                128
            } else {
                data.len()
            };
            let i = rng.random_range(0..limit);
            data[i] = rng.random();
        }
        if rng.random_bool(0.1) {
            let cut = rng.random_range(0..data.len());
            data.truncate(cut);
        }
        header_input(&data);
    }
    // Pure noise too.
    for _ in 0..100 {
        let len = rng.random_range(0..2048);
        let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
        header_input(&data);
    }
}

/// 24 random request sequences from `seed` through `run`.
fn random_request_sequences(seed: u64, run: fn(&[u8])) {
    let mut rng = StdRng::seed_from_u64(seed);
    for _ in 0..24 {
        let len = rng.random_range(1..600);
        let data: Vec<u8> = (0..len).map(|_| rng.random()).collect();
        run(&data);
    }
}

#[test]
fn random_request_sequences_match_a_model() {
    random_request_sequences(7, ops_input);
}

#[test]
fn random_request_sequences_through_the_concurrent_engine_match_a_model() {
    random_request_sequences(8, concurrent_ops_input);
}
