//! Shared test workload: a deterministic random transaction generator per
//! worker, an in-memory model of what the store must contain, and a checker
//! that compares a store against the model.
#![allow(dead_code)]

use bytes::Bytes;
use cairn_store::{CollectionId, ListStart, ObjectId, Store, Transaction};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::BTreeMap;

pub const OBJECTS_PER_WORKER: usize = 5;
const MAX_OFF: u64 = 300 << 10;

#[derive(Clone, Debug, Default, PartialEq)]
pub struct MObj {
    pub data: Vec<u8>,
    pub attrs: BTreeMap<String, Vec<u8>>,
    pub omap: BTreeMap<Vec<u8>, Vec<u8>>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct Model {
    pub idx: u64,
    pub objs: BTreeMap<String, MObj>,
    pub log: BTreeMap<u64, Vec<u8>>,
    pub meta: BTreeMap<String, Vec<u8>>,
}

#[derive(Clone, Debug)]
pub enum MOp {
    Write(String, u64, Vec<u8>),
    Zero(String, u64, u64),
    Truncate(String, u64),
    Remove(String),
    Clone(String, String),
    CloneRange(String, String, u64, u64, u64),
    SetAttr(String, String, Vec<u8>),
    RmAttr(String, String),
    OmapSet(String, Vec<(Vec<u8>, Vec<u8>)>),
    OmapRm(String, Vec<Vec<u8>>),
    OmapRmRange(String, Vec<u8>, Vec<u8>),
    OmapClear(String),
    Log(u64, Vec<u8>),
    LogTrim(u64),
    Meta(String, Vec<u8>),
}

pub fn coll(worker: usize) -> CollectionId {
    CollectionId::pg(2, worker as u32)
}

pub fn oid(name: &str) -> ObjectId {
    ObjectId::new(crc32c::crc32c(name.as_bytes()), name)
}

fn bytes(rng: &mut StdRng, n: usize) -> Vec<u8> {
    let mut v = vec![0u8; n];
    rng.fill(&mut v[..]);
    v
}

fn rbytes(rng: &mut StdRng, max: usize) -> Vec<u8> {
    let n = rng.gen_range(0..max);
    bytes(rng, n)
}

fn okey(k: u32) -> Vec<u8> {
    format!("k{k:03}").into_bytes()
}

/// Ops of transaction `idx` (1-based) of `worker`, valid for `m` (the state after idx-1).
pub fn gen(seed: u64, worker: usize, idx: u64, m: &Model) -> Vec<MOp> {
    let mut rng = StdRng::seed_from_u64(
        seed ^ ((worker as u64) << 40) ^ idx.wrapping_mul(0x9E37_79B9_7F4A_7C15),
    );
    let names: Vec<String> = (0..OBJECTS_PER_WORKER)
        .map(|k| format!("w{worker}.obj{k}"))
        .collect();
    let mut exists: std::collections::BTreeSet<String> = m.objs.keys().cloned().collect();
    let mut ops = Vec::new();
    for _ in 0..rng.gen_range(1..=4) {
        let existing: Vec<&String> = exists.iter().collect();
        let any = names[rng.gen_range(0..names.len())].clone();
        let ex = if existing.is_empty() {
            None
        } else {
            Some(existing[rng.gen_range(0..existing.len())].clone())
        };
        let choice = rng.gen_range(0..100);
        let op = match (choice, ex) {
            (0..=34, _) => {
                let len = match rng.gen_range(0..4) {
                    0 => 4096,
                    1 => rng.gen_range(1..100),
                    2 => rng.gen_range(1..80_000),
                    _ => 64 << 10,
                };
                let off = if rng.gen_bool(0.5) {
                    rng.gen_range(0..MAX_OFF / 4096) * 4096
                } else {
                    rng.gen_range(0..MAX_OFF)
                };
                MOp::Write(any, off, bytes(&mut rng, len))
            }
            (35..=39, _) => MOp::Zero(any, rng.gen_range(0..MAX_OFF), rng.gen_range(0..70_000)),
            (40..=44, _) => MOp::Truncate(any, rng.gen_range(0..MAX_OFF)),
            (45..=48, Some(e)) => MOp::Remove(e),
            (49..=52, Some(e)) if e != any => MOp::Clone(e, any),
            (53..=57, Some(e)) if e != any => MOp::CloneRange(
                e,
                any,
                rng.gen_range(0..MAX_OFF),
                rng.gen_range(0..100_000),
                rng.gen_range(0..MAX_OFF),
            ),
            (58..=67, Some(e)) => {
                MOp::SetAttr(e, format!("a{}", rng.gen_range(0..3)), rbytes(&mut rng, 40))
            }
            (68..=70, Some(e)) => MOp::RmAttr(e, format!("a{}", rng.gen_range(0..3))),
            (71..=85, Some(e)) => {
                let n = rng.gen_range(1..6);
                MOp::OmapSet(
                    e,
                    (0..n)
                        .map(|_| (okey(rng.gen_range(0..60)), rbytes(&mut rng, 30)))
                        .collect(),
                )
            }
            (86..=91, Some(e)) => {
                MOp::OmapRm(e, (0..3).map(|_| okey(rng.gen_range(0..60))).collect())
            }
            (92..=95, Some(e)) => {
                let a = rng.gen_range(0..60);
                MOp::OmapRmRange(e, okey(a), okey(a + rng.gen_range(0..10)))
            }
            (96..=97, Some(e)) => MOp::OmapClear(e),
            _ => MOp::Write(any, rng.gen_range(0..MAX_OFF), bytes(&mut rng, 3000)),
        };
        match &op {
            MOp::Remove(n) => {
                exists.remove(n);
            }
            MOp::Write(n, ..)
            | MOp::Zero(n, ..)
            | MOp::Truncate(n, _)
            | MOp::Clone(_, n)
            | MOp::CloneRange(_, n, ..) => {
                exists.insert(n.clone());
            }
            _ => {}
        }
        ops.push(op);
    }
    ops.push(MOp::Log(idx, idx.to_le_bytes().to_vec()));
    if idx.is_multiple_of(10) {
        ops.push(MOp::LogTrim(idx - 5));
    }
    ops.push(MOp::Meta("last".into(), idx.to_le_bytes().to_vec()));
    ops
}

fn resize_to(d: &mut Vec<u8>, n: u64) {
    if (d.len() as u64) < n {
        d.resize(n as usize, 0);
    }
}

pub fn apply(m: &mut Model, ops: &[MOp]) {
    for op in ops {
        match op {
            MOp::Write(n, off, data) => {
                let o = m.objs.entry(n.clone()).or_default();
                if !data.is_empty() {
                    resize_to(&mut o.data, off + data.len() as u64);
                    o.data[*off as usize..*off as usize + data.len()].copy_from_slice(data);
                }
            }
            MOp::Zero(n, off, len) => {
                let o = m.objs.entry(n.clone()).or_default();
                if *len > 0 {
                    resize_to(&mut o.data, off + len);
                    o.data[*off as usize..(off + len) as usize].fill(0);
                }
            }
            MOp::Truncate(n, s) => m
                .objs
                .entry(n.clone())
                .or_default()
                .data
                .resize(*s as usize, 0),
            MOp::Remove(n) => {
                m.objs.remove(n);
            }
            MOp::Clone(s, d) => {
                let src = m.objs[s].clone();
                m.objs.insert(d.clone(), src);
            }
            MOp::CloneRange(s, d, soff, len, doff) => {
                let src = m.objs[s].data.clone();
                let len = (*len).min((src.len() as u64).saturating_sub(*soff));
                let o = m.objs.entry(d.clone()).or_default();
                if len > 0 {
                    resize_to(&mut o.data, doff + len);
                    o.data[*doff as usize..(doff + len) as usize]
                        .copy_from_slice(&src[*soff as usize..(soff + len) as usize]);
                }
            }
            MOp::SetAttr(n, k, v) => {
                m.objs
                    .get_mut(n)
                    .map(|o| o.attrs.insert(k.clone(), v.clone()));
            }
            MOp::RmAttr(n, k) => {
                m.objs.get_mut(n).map(|o| o.attrs.remove(k));
            }
            MOp::OmapSet(n, kv) => {
                if let Some(o) = m.objs.get_mut(n) {
                    for (k, v) in kv {
                        o.omap.insert(k.clone(), v.clone());
                    }
                }
            }
            MOp::OmapRm(n, ks) => {
                if let Some(o) = m.objs.get_mut(n) {
                    for k in ks {
                        o.omap.remove(k);
                    }
                }
            }
            MOp::OmapRmRange(n, a, b) => {
                if let Some(o) = m.objs.get_mut(n) {
                    o.omap.retain(|k, _| !(k >= a && k < b));
                }
            }
            MOp::OmapClear(n) => {
                if let Some(o) = m.objs.get_mut(n) {
                    o.omap.clear();
                }
            }
            MOp::Log(i, e) => {
                m.log.insert(*i, e.clone());
            }
            MOp::LogTrim(u) => m.log.retain(|i, _| i > u),
            MOp::Meta(k, v) => {
                m.meta.insert(k.clone(), v.clone());
            }
        }
    }
}

pub fn to_txn(c: CollectionId, ops: &[MOp]) -> Transaction {
    let mut t = Transaction::new();
    let b = |v: &Vec<u8>| Bytes::from(v.clone());
    for op in ops {
        match op {
            MOp::Write(n, off, data) => t.write(c, oid(n), *off, b(data)),
            MOp::Zero(n, off, len) => t.zero(c, oid(n), *off, *len),
            MOp::Truncate(n, s) => t.truncate(c, oid(n), *s),
            MOp::Remove(n) => t.remove(c, oid(n)),
            MOp::Clone(s, d) => t.clone_object(c, oid(s), oid(d)),
            MOp::CloneRange(s, d, so, l, dof) => t.clone_range(c, oid(s), oid(d), *so, *l, *dof),
            MOp::SetAttr(n, k, v) => t.setattr(c, oid(n), k.clone(), b(v)),
            MOp::RmAttr(n, k) => t.rmattr(c, oid(n), k.clone()),
            MOp::OmapSet(n, kv) => {
                t.omap_set(c, oid(n), kv.iter().map(|(k, v)| (b(k), b(v))).collect())
            }
            MOp::OmapRm(n, ks) => t.omap_rm(c, oid(n), ks.iter().map(b).collect()),
            MOp::OmapRmRange(n, a, z) => t.omap_rm_range(c, oid(n), b(a), b(z)),
            MOp::OmapClear(n) => t.omap_clear(c, oid(n)),
            MOp::Log(i, e) => t.log_append(c, *i, b(e)),
            MOp::LogTrim(u) => t.log_trim(c, *u),
            MOp::Meta(k, v) => t.meta_set(c, k.clone(), b(v)),
        };
    }
    t
}

/// Advances `m` to transaction `idx` by regenerating and applying.
pub fn advance(seed: u64, worker: usize, m: &mut Model, idx: u64) {
    while m.idx < idx {
        let ops = gen(seed, worker, m.idx + 1, m);
        apply(m, &ops);
        m.idx += 1;
    }
}

/// Index of the last transaction of `worker` present in the store (0 if none).
pub fn last_applied(s: &Store, worker: usize) -> u64 {
    match s.meta_get(&coll(worker), "last").expect("meta_get") {
        Some(v) => u64::from_le_bytes(v.as_slice().try_into().expect("8 bytes")),
        None => 0,
    }
}

/// Asserts that the store's contents for `worker` equal `m` exactly.
pub fn check(s: &Store, worker: usize, m: &Model) {
    let c = coll(worker);
    let mut listed = Vec::new();
    let mut start = ListStart::Beginning;
    loop {
        let page = s.list_objects(&c, &start, 2).expect("list");
        let Some(last) = page.last().cloned() else {
            break;
        };
        listed.extend(page);
        start = ListStart::After(last);
    }
    let mut names: Vec<String> = listed.iter().map(|o| o.name.clone()).collect();
    // Listing is in bit-reversed hash order.
    let keys: Vec<u32> = listed.iter().map(|o| o.hash.reverse_bits()).collect();
    assert!(
        keys.windows(2).all(|w| w[0] <= w[1]),
        "listing not in hash order"
    );
    names.sort();
    assert_eq!(
        names,
        m.objs.keys().cloned().collect::<Vec<_>>(),
        "object set of worker {worker} at txn {}",
        m.idx
    );
    for (n, mo) in &m.objs {
        let o = oid(n);
        let st = s.stat(&c, &o).expect("stat");
        assert_eq!(
            st.size,
            mo.data.len() as u64,
            "size of {n} at txn {}",
            m.idx
        );
        let d = s.read(&c, &o, 0, st.size + 10).expect("read");
        assert!(d == mo.data, "data of {n} differs at txn {}", m.idx);
        let attrs: BTreeMap<String, Vec<u8>> = s.getattrs(&c, &o).expect("attrs");
        assert_eq!(attrs, mo.attrs, "attrs of {n}");
        let om: BTreeMap<Vec<u8>, Vec<u8>> = s
            .omap_range(&c, &o, None, 10_000)
            .expect("omap")
            .into_iter()
            .collect();
        assert_eq!(om, mo.omap, "omap of {n} at txn {}", m.idx);
    }
    let log: BTreeMap<u64, Vec<u8>> = s
        .log_range(&c, 0, 100_000)
        .expect("log")
        .into_iter()
        .collect();
    assert_eq!(log, m.log, "pg log of worker {worker}");
}
