//! Scale check (soak only, `CAIRN_SOAK=1`): a 100-OSD, 20-pool map; prints
//! the cost of apply, health, osd tree, PG placement and encoding.

mod common;
use cairn_map::*;
use common::*;
use std::time::Instant;

#[test]
fn scale_timings() {
    if std::env::var("CAIRN_SOAK").as_deref() != Ok("1") {
        return;
    }
    let t = Instant::now();
    let mut m = cluster(10, 10);
    println!("build 100 OSDs: {:?}", t.elapsed());
    for i in 0..20 {
        ok(&mut m, &format!("osd pool create p{i} 128"));
    }
    let n = 200;
    let t = Instant::now();
    for i in 0..n {
        ok(
            &mut m,
            if i % 2 == 0 {
                "osd set noout"
            } else {
                "osd unset noout"
            },
        );
    }
    println!("apply (flag toggle): {:?} each", t.elapsed() / n);
    let t = Instant::now();
    let h = m.health(&HealthInputs::default());
    println!(
        "health (20 pools x 64 placement samples): {:?} -> {}",
        t.elapsed(),
        h.status.as_str()
    );
    let t = Instant::now();
    let tree = ok(&mut m, "osd tree");
    println!(
        "osd tree: {:?} ({} lines)",
        t.elapsed(),
        tree.lines().count()
    );
    let t = Instant::now();
    for seed in 0..128 {
        m.pg_to_up(1, seed).unwrap();
    }
    println!("pg_to_up: {:?} each", t.elapsed() / 128);
    let t = Instant::now();
    let buf = m.encode();
    println!("encode: {:?}, {} bytes", t.elapsed(), buf.len());
    let t = Instant::now();
    ClusterMap::decode(&buf).unwrap();
    println!("decode: {:?}", t.elapsed());
}
