//! The map of issue 2's performance target, shared by the criterion bench
//! and the `mapping_rate` example: 100 hosts x 12 OSDs of 4 TiB (class hdd)
//! under root `default`, and `replicated_rule` (chooseleaf firstn 0 type
//! host), mapped with 3 replicas.

use cairn_crush::CrushMap;

/// Hosts in the bench map.
pub const HOSTS: i32 = 100;
/// OSDs per host.
pub const OSDS_PER_HOST: i32 = 12;
/// Replicas per mapping.
pub const REPLICAS: usize = 3;

/// Builds the bench map; returns it with the id of its replicated rule.
pub fn bench_map() -> (CrushMap, i32) {
    let mut map = CrushMap::new();
    map.add_bucket("default", "root", None).expect("root");
    for h in 0..HOSTS {
        let host = format!("host{h}");
        for d in 0..OSDS_PER_HOST {
            map.add_device(
                h * OSDS_PER_HOST + d,
                Some("hdd"),
                4.0,
                &[("host", &host), ("root", "default")],
            )
            .expect("device");
        }
    }
    let rule = map
        .add_replicated_rule("replicated_rule", "default", "host", None)
        .expect("rule");
    (map, rule)
}
