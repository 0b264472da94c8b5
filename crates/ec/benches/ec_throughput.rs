//! Encode and decode throughput of whole 4 MiB objects, one core, for the
//! profiles the issue names. Throughput is logical object bytes per second.
//! `decode_degraded` loses the first m data chunks (the most decoding work);
//! `decode_healthy` has every data chunk (no Reed-Solomon work at all).

use bytes::Bytes;
use cairn_ec::ErasureCode;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::time::Duration;

const OBJECT_BYTES: usize = 4 << 20;

fn object() -> Bytes {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    (0..OBJECT_BYTES)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect::<Vec<u8>>()
        .into()
}

fn bench(c: &mut Criterion) {
    let data = object();
    let mut group = c.benchmark_group("ec_4MiB");
    group.throughput(Throughput::Bytes(OBJECT_BYTES as u64));
    group.sample_size(20);
    group.warm_up_time(Duration::from_millis(500));
    group.measurement_time(Duration::from_secs(2));
    for (k, m) in [(2usize, 1usize), (4, 2), (8, 3)] {
        for su in [4096u64, 65536] {
            let code = ErasureCode::new(k, m, su).expect("profile");
            let name = format!("{k}+{m}_su{}K", su / 1024);
            group.bench_function(BenchmarkId::new("encode", &name), |b| {
                b.iter(|| code.encode(&data).expect("encode"))
            });
            let chunks = code.encode(&data).expect("encode");
            let degraded: Vec<Option<Bytes>> = chunks
                .iter()
                .enumerate()
                .map(|(i, c)| (i >= m).then(|| c.clone()))
                .collect();
            let healthy: Vec<Option<Bytes>> = chunks.iter().cloned().map(Some).collect();
            let size = OBJECT_BYTES as u64;
            group.bench_function(BenchmarkId::new("decode_degraded", &name), |b| {
                b.iter(|| code.decode(&degraded, size).expect("decode"))
            });
            group.bench_function(BenchmarkId::new("decode_healthy", &name), |b| {
                b.iter(|| code.decode(&healthy, size).expect("decode"))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
