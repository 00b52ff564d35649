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

/// Parses `NAME=PID` (for clap).
pub(super) fn parse_group(s: &str) -> Result<Group, String> {
    let (name, pid) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected NAME=PID"))?;
    let pid = pid
        .trim()
        .parse::<u32>()
        .map_err(|e| format!("{s:?}: the pid is not a number: {e}"))?;
    if name.is_empty() {
        return Err(format!("{s:?}: the name is empty"));
    }
    Ok(Group {
        name: name.to_owned(),
        pid,
    })
}

/// CPU seconds per group at one moment (a group whose top process is gone is missing).
#[derive(Debug, Clone, Default)]
pub(super) struct Snapshot(Vec<(String, Option<f64>)>);

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
    Snapshot(out)
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
        let before = Snapshot(vec![
            ("server".into(), Some(1.0)),
            ("gone".into(), Some(1.0)),
            ("signetctl".into(), Some(0.5)),
        ]);
        let after = Snapshot(vec![
            ("server".into(), Some(3.0)),
            ("gone".into(), None),
            ("signetctl".into(), Some(1.0)),
        ]);
        let line = per_request(&before, &after, 10_000);
        assert_eq!(line, "server 200 µs, gone n/a, signetctl 50 µs; all 250 µs");
        assert_eq!(total_of(&line), Some(250.0));
        assert_eq!(ceiling(250.0, 2), 8_000.0);
        assert_eq!(per_request(&before, &after, 0), "no request answered");
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
