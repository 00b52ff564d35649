//! Where the machine's CPU went during a measured window, per process group: `--cpu
//! NAME=PID` names a process whose CPU time, and that of every process below it (a
//! PostgreSQL postmaster's backends, WAL writer, ...), counts for NAME; `signetctl` itself is
//! always a group. Divided by the requests answered, this says what one issuance costs the
//! whole machine: the server, its database and the load generator, which on a shared 2-core
//! machine all take from the same budget.
//!
//! Read from `/proc/<pid>/stat` (utime + stime, in the kernel's USER_HZ ticks), so Linux
//! only; elsewhere, or for a process that is gone, the figure is missing, never made up.
//! A process that ended inside the window loses its ticks (they move to its parent's
//! children's total only when reaped), so short-lived children are undercounted: say so when
//! reading the figures, the groups measured here (the server, PostgreSQL's long-lived
//! connections, cfssl) keep their processes for the whole run.

use std::collections::HashMap;

use anyhow::{Context, anyhow};

/// The kernel's USER_HZ: `/proc` reports CPU time in these ticks, 100 per second on every
/// architecture Linux ships for (it is part of the ABI, whatever the kernel's HZ).
const TICKS_PER_SECOND: f64 = 100.0;

/// A process group to measure: a name and the pid at its top.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Group {
    pub name: String,
    pub pid: u32,
}

/// A `--cpu` value that is not `NAME=PID` (the value, as given).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(super) enum BadGroup {
    #[error("{0:?}: expected NAME=PID")]
    NoEquals(String),
    #[error("{0:?}: the pid is not a number: {1}")]
    BadPid(String, std::num::ParseIntError),
    #[error("{0:?}: the name is empty")]
    NoName(String),
}

/// Parses `NAME=PID` (for clap).
pub(super) fn parse_group(s: &str) -> Result<Group, BadGroup> {
    let (name, pid) = s
        .split_once('=')
        .ok_or_else(|| BadGroup::NoEquals(s.to_owned()))?;
    let pid = pid
        .trim()
        .parse::<u32>()
        .map_err(|e| BadGroup::BadPid(s.to_owned(), e))?;
    if name.is_empty() {
        return Err(BadGroup::NoName(s.to_owned()));
    }
    Ok(Group {
        name: name.to_owned(),
        pid,
    })
}

/// CPU seconds per group at one moment (a group whose top process is gone is missing), and
/// the whole machine's CPU ticks by state (missing where `/proc/stat` cannot be read).
#[derive(Debug, Clone, Default)]
pub(super) struct Snapshot(Vec<(String, Option<f64>)>, Option<Machine>);

/// The machine's CPU ticks since boot, all cores summed, by what the time went to
/// (`/proc/stat`'s first line).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Machine {
    /// user, nice, system, irq, softirq: running something.
    busy: u64,
    /// idle: nothing to run.
    idle: u64,
    /// iowait: nothing to run while a disk request was outstanding (the database's flushes).
    iowait: u64,
    /// Taken by the hypervisor for other guests while this one had work: a slow hour on a
    /// shared host shows here, not in any process's figures.
    steal: u64,
}

/// Parses `/proc/stat`'s `cpu` line (`cpu user nice system idle iowait irq softirq steal ...`).
fn parse_machine(stat: &str) -> Option<Machine> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    let at = |i: usize| v.get(i).copied().unwrap_or(0);
    if v.len() < 4 {
        return None;
    }
    Some(Machine {
        busy: at(0) + at(1) + at(2) + at(5) + at(6),
        idle: at(3),
        iowait: at(4),
        steal: at(7),
    })
}

/// Where the machine's CPU time went between `before` and `after`, as one line:
/// `busy 93.1%, idle 3.0%, waiting on disk 1.0%, stolen by the host 2.9%`; None when either
/// reading is missing.
pub(super) fn machine_line(before: &Snapshot, after: &Snapshot) -> Option<String> {
    let (b, a) = (before.1?, after.1?);
    let d = |x: u64, y: u64| x.saturating_sub(y) as f64;
    let busy = d(a.busy, b.busy);
    let idle = d(a.idle, b.idle);
    let iowait = d(a.iowait, b.iowait);
    let steal = d(a.steal, b.steal);
    let all = busy + idle + iowait + steal;
    if all <= 0.0 {
        return None;
    }
    let pct = |x: f64| 100.0 * x / all;
    Some(format!(
        "busy {:.1}%, idle {:.1}%, waiting on disk {:.1}%, stolen by the host {:.1}%",
        pct(busy),
        pct(idle),
        pct(iowait),
        pct(steal)
    ))
}

/// Reads the CPU time of each group, and of this process as `signetctl`.
pub(super) fn snapshot(groups: &[Group]) -> Snapshot {
    let table = read_table().unwrap_or_default();
    let children = children_of(&table);
    let mut out: Vec<(String, Option<f64>)> = groups
        .iter()
        .map(|g| (g.name.clone(), tree_seconds(&table, &children, g.pid)))
        .collect();
    out.push((
        "signetctl".to_owned(),
        tree_seconds(&table, &children, std::process::id()),
    ));
    let machine = std::fs::read_to_string("/proc/stat")
        .ok()
        .and_then(|s| parse_machine(&s));
    Snapshot(out, machine)
}

/// The CPU each group used between `before` and `after`, per answered request, as one line:
/// `signet-server 241 µs, postgres 52 µs, signetctl 40 µs; all 333 µs`.
pub(super) fn per_request(before: &Snapshot, after: &Snapshot, requests: usize) -> String {
    if requests == 0 {
        return "no request answered".to_owned();
    }
    let mut parts = Vec::new();
    let mut total = 0.0;
    for ((name, b), (_, a)) in before.0.iter().zip(after.0.iter()) {
        match (b, a) {
            (Some(b), Some(a)) => {
                let us = (a - b).max(0.0) * 1e6 / requests as f64;
                total += us;
                parts.push(format!("{name} {us:.0} µs"));
            }
            _ => parts.push(format!("{name} n/a")),
        }
    }
    format!("{}; all {total:.0} µs", parts.join(", "))
}

/// What the whole machine could answer per second at `us_per_request` µs of CPU each, with
/// every core busy.
pub(super) fn ceiling(us_per_request: f64, cores: usize) -> f64 {
    if us_per_request <= 0.0 {
        return 0.0;
    }
    cores as f64 * 1e6 / us_per_request
}

/// Sum of the `all N µs` figure in a [`per_request`] line (for the ceiling).
pub(super) fn total_of(line: &str) -> Option<f64> {
    line.rsplit_once("all ")?
        .1
        .trim_end_matches(" µs")
        .parse()
        .ok()
}

/// One process: its parent and its CPU seconds so far.
#[derive(Debug, Clone, Copy)]
struct Proc {
    ppid: u32,
    seconds: f64,
}

/// Every process's parent and CPU time, from `/proc`.
fn read_table() -> anyhow::Result<HashMap<u32, Proc>> {
    let mut table = HashMap::new();
    for entry in std::fs::read_dir("/proc").context("reading /proc")? {
        let Ok(entry) = entry else { continue };
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        // Processes come and go while we read: a missing one is skipped.
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        if let Ok(p) = parse_stat(&stat) {
            table.insert(pid, p);
        }
    }
    Ok(table)
}

/// Parses `/proc/<pid>/stat`: after the `(comm)` (which may hold spaces and parentheses),
/// field 4 is the parent, fields 14 and 15 the user and system ticks.
fn parse_stat(stat: &str) -> anyhow::Result<Proc> {
    let rest = stat
        .rfind(')')
        .map(|i| &stat[i + 1..])
        .ok_or_else(|| anyhow!("no (comm) in a stat line"))?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // fields[0] is field 3 (state).
    let get = |n: usize| -> anyhow::Result<u64> {
        fields
            .get(n - 3)
            .ok_or_else(|| anyhow!("stat has no field {n}"))?
            .parse::<u64>()
            .with_context(|| format!("stat field {n}"))
    };
    Ok(Proc {
        ppid: u32::try_from(get(4)?).context("ppid")?,
        seconds: (get(14)? + get(15)?) as f64 / TICKS_PER_SECOND,
    })
}

/// Each process's children, from the table's parents (built once per snapshot).
fn children_of(table: &HashMap<u32, Proc>) -> HashMap<u32, Vec<u32>> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for (&pid, p) in table {
        children.entry(p.ppid).or_default().push(pid);
    }
    children
}

/// CPU seconds of `top` and everything below it; None when `top` is gone.
fn tree_seconds(
    table: &HashMap<u32, Proc>,
    children: &HashMap<u32, Vec<u32>>,
    top: u32,
) -> Option<f64> {
    table.get(&top)?;
    let mut total = 0.0;
    let mut stack = vec![top];
    // A pid can only appear once in the table, so the walk ends; the bound guards against a
    // corrupt table all the same.
    let mut steps = 0usize;
    while let Some(pid) = stack.pop() {
        steps += 1;
        if steps > table.len() + 1 {
            break;
        }
        if let Some(p) = table.get(&pid) {
            total += p.seconds;
        }
        if let Some(c) = children.get(&pid) {
            stack.extend(c.iter().copied().filter(|&c| c != pid));
        }
    }
    Some(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stat_line_with_spaces_and_parentheses_in_its_name_parses() {
        let line =
            "4242 (tokio (rt) 1) S 17 4242 4242 0 -1 4194560 100 0 0 0 250 75 0 0 20 0 9 0 1 2 3";
        let p = parse_stat(line).expect("parse");
        assert_eq!(p.ppid, 17);
        assert!((p.seconds - 3.25).abs() < 1e-9);
        assert!(parse_stat("garbage").is_err());
        assert!(parse_stat("1 (x) S notanumber").is_err());
    }

    #[test]
    fn a_group_counts_its_descendants_and_nothing_else() {
        let t = |ppid, seconds| Proc { ppid, seconds };
        let table = HashMap::from([
            (1, t(0, 100.0)),
            (10, t(1, 2.0)),
            (11, t(10, 0.5)),
            (12, t(11, 0.25)),
            (20, t(1, 7.0)),
        ]);
        let children = children_of(&table);
        assert_eq!(tree_seconds(&table, &children, 10), Some(2.75));
        assert_eq!(tree_seconds(&table, &children, 20), Some(7.0));
        assert_eq!(tree_seconds(&table, &children, 99), None);
    }

    #[test]
    fn per_request_divides_the_difference_and_says_what_is_missing() {
        let before = Snapshot(
            vec![
                ("server".into(), Some(1.0)),
                ("gone".into(), Some(1.0)),
                ("signetctl".into(), Some(0.5)),
            ],
            None,
        );
        let after = Snapshot(
            vec![
                ("server".into(), Some(3.0)),
                ("gone".into(), None),
                ("signetctl".into(), Some(1.0)),
            ],
            None,
        );
        let line = per_request(&before, &after, 10_000);
        assert_eq!(line, "server 200 µs, gone n/a, signetctl 50 µs; all 250 µs");
        assert_eq!(total_of(&line), Some(250.0));
        assert_eq!(ceiling(250.0, 2), 8_000.0);
        assert_eq!(per_request(&before, &after, 0), "no request answered");
    }

    #[test]
    fn the_machine_line_splits_the_window_into_busy_idle_and_stolen() {
        let before = "cpu  100 0 50 1000 10 0 5 20 0 0\ncpu0 50 0 25 500 5 0 2 10 0 0\n";
        let after = "cpu  280 0 90 1050 20 0 15 60 0 0\ncpu0 1 1 1 1\n";
        let b = parse_machine(before).expect("before");
        assert_eq!(
            b,
            Machine {
                busy: 155,
                idle: 1000,
                iowait: 10,
                steal: 20
            }
        );
        let a = parse_machine(after).expect("after");
        let snap = |m| Snapshot(Vec::new(), Some(m));
        // busy 385-155 = 230, idle 1050-1000 = 50, iowait 20-10 = 10, steal 40: of 330.
        assert_eq!(
            machine_line(&snap(b), &snap(a)).as_deref(),
            Some("busy 69.7%, idle 15.2%, waiting on disk 3.0%, stolen by the host 12.1%")
        );
        assert_eq!(machine_line(&snap(b), &Snapshot::default()), None);
        assert_eq!(machine_line(&snap(b), &snap(b)), None);
        assert_eq!(parse_machine("cpu0 1 2 3 4\n"), None);
        assert_eq!(parse_machine("cpu  1 2 x 4\n"), None);
        assert_eq!(parse_machine("cpu  1 2\n"), None);
    }

    #[test]
    fn groups_parse_from_name_equals_pid() {
        assert_eq!(
            parse_group("postgres=123"),
            Ok(Group {
                name: "postgres".into(),
                pid: 123
            })
        );
        assert!(parse_group("postgres").is_err());
        assert!(parse_group("=1").is_err());
        assert!(parse_group("x=abc").is_err());
    }

    #[test]
    fn this_process_is_always_measured() {
        let s = snapshot(&[]);
        assert_eq!(s.0.len(), 1);
        assert_eq!(s.0[0].0, "signetctl");
        assert!(s.0[0].1.is_some(), "/proc/self is readable on Linux");
    }
}
