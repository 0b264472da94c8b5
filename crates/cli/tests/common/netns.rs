//! Network namespaces for partition tests: one namespace per host plus one
//! for clients, each with a veth link to a bridge in a "switch" namespace of
//! its own, so no traffic ever touches the machine's own network (the
//! root namespace gets no interface, address or route). A host is cut off
//! by taking its switch port down and healed by bringing it up. Every
//! namespace is deleted when the `Netns` is dropped (also on panic), and
//! leftovers of earlier runs whose test process is gone are deleted first.
#![allow(dead_code)]

use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// Every namespace this harness creates starts with this.
const PREFIX: &str = "cft";
/// The private subnet inside the namespaces (never routed anywhere else).
const SUBNET: &str = "10.77.0";
/// Last octet of the client namespace's address.
const CLIENT_OCTET: u32 = 100;

static NEXT: AtomicU32 = AtomicU32::new(0);

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("running ip {args:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

/// A set of namespaces: `hosts[i]` for host i, `client`, and the switch.
pub struct Netns {
    pub hosts: Vec<String>,
    pub client: String,
    switch: String,
}

impl Netns {
    /// Creates the namespaces, links and addresses for `hosts` hosts.
    pub fn create(hosts: usize) -> Result<Netns, String> {
        remove_leftovers();
        let tag = format!(
            "{PREFIX}{}x{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::SeqCst)
        );
        let n = Netns {
            hosts: (0..hosts).map(|i| format!("{tag}h{i}")).collect(),
            client: format!("{tag}cl"),
            switch: format!("{tag}sw"),
        };
        // Created one by one so that Drop deletes whatever was made.
        let all: Vec<String> = n
            .hosts
            .iter()
            .chain([&n.client, &n.switch])
            .cloned()
            .collect();
        for ns in &all {
            ip(&["netns", "add", ns])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        ip(&["-n", &n.switch, "link", "add", "br0", "type", "bridge"])?;
        ip(&["-n", &n.switch, "link", "set", "br0", "up"])?;
        let ends: Vec<(String, u32)> = n
            .hosts
            .iter()
            .enumerate()
            .map(|(i, h)| (h.clone(), i as u32 + 1))
            .chain([(n.client.clone(), CLIENT_OCTET)])
            .collect();
        for (ns, octet) in ends {
            let port = format!("p{octet}");
            ip(&[
                "link", "add", "eth0", "netns", &ns, "type", "veth", "peer", "name", &port,
                "netns", &n.switch,
            ])?;
            ip(&["-n", &n.switch, "link", "set", &port, "master", "br0"])?;
            ip(&["-n", &n.switch, "link", "set", &port, "up"])?;
            ip(&[
                "-n",
                &ns,
                "addr",
                "add",
                &format!("{SUBNET}.{octet}/24"),
                "dev",
                "eth0",
            ])?;
            ip(&["-n", &ns, "link", "set", "eth0", "up"])?;
        }
        Ok(n)
    }

    /// Host i's address inside the namespaces.
    pub fn host_ip(i: usize) -> String {
        format!("{SUBNET}.{}", i + 1)
    }

    /// Cuts host i off from everyone (its switch port goes down): packets
    /// are dropped silently, as when a cable or switch port fails.
    pub fn cut(&self, i: usize) -> Result<(), String> {
        ip(&[
            "-n",
            &self.switch,
            "link",
            "set",
            &format!("p{}", i + 1),
            "down",
        ])
    }

    /// Undoes `cut`.
    pub fn heal(&self, i: usize) -> Result<(), String> {
        ip(&[
            "-n",
            &self.switch,
            "link",
            "set",
            &format!("p{}", i + 1),
            "up",
        ])
    }

    /// Moves the calling thread (only it, and threads it starts later)
    /// into namespace `ns`.
    pub fn enter(ns: &str) -> Result<(), String> {
        use std::os::fd::AsRawFd;
        let f = std::fs::File::open(format!("/var/run/netns/{ns}"))
            .map_err(|e| format!("opening namespace {ns}: {e}"))?;
        // SAFETY: setns on a valid namespace fd only changes this thread's
        // network namespace.
        let r = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
        if r != 0 {
            return Err(format!(
                "setns into {ns}: {}",
                std::io::Error::last_os_error()
            ));
        }
        Ok(())
    }

    /// Why namespaces cannot be used here, if they cannot.
    pub fn unavailable() -> Option<String> {
        let probe = format!("{PREFIX}{}probe", std::process::id());
        match ip(&["netns", "add", &probe]) {
            Ok(()) => {
                let _ = ip(&["netns", "del", &probe]);
                None
            }
            Err(e) => Some(e),
        }
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for ns in self.hosts.iter().chain([&self.client, &self.switch]) {
            let _ = ip(&["netns", "del", ns]);
        }
    }
}

/// Deletes namespaces of this harness left by test processes that died
/// without cleaning up (the process id is part of the name).
fn remove_leftovers() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let name = line.split_whitespace().next().unwrap_or("");
        let Some(rest) = name.strip_prefix(PREFIX) else {
            continue;
        };
        let pid: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
        let Ok(pid) = pid.parse::<u32>() else {
            continue;
        };
        if pid != std::process::id() && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = ip(&["netns", "del", name]);
        }
    }
}
