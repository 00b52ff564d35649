//! The command blocks of README.md and docs/*.md, run as written (issue 25, item 6; the
//! operator guide, issue 30), so the documentation cannot drift from the code again.
//!
//! A section is found by its heading in whichever document holds it (exactly one may). Every
//! fenced block of those documents whose info string starts with `sh` is one of:
//! - ```` ```sh ```` — commands an operator types: run by [`walkthrough_from_an_empty_machine`]
//!   [`operator_walkthrough_rotation_compromise_revocation`] or
//!   [`daily_checks_and_a_restore_drill`], each finding its section by heading (never by line
//!   number);
//! - ```` ```sh title="synopsis" ```` — a reference of `signetctl` usage lines (`[--json]`,
//!   `KEY_ID`, `a|b`): every subcommand path and every flag on a line must exist in
//!   `signetctl … --help`;
//! - ```` ```sh title="not run: why" ```` — cannot run here (Kubernetes, a benchmark, the
//!   build itself); skipped.
//!
//! [`every_sh_block_is_run_checked_or_marked`] fails for a `sh` block outside the sections
//! tested here that is not marked, so a new command block needs a test or a reason.
//!
//! What the tests substitute, and nothing else:
//! - the walkthrough's first line, `cargo build --release --bins && export PATH=…`, becomes
//!   `export PATH=<the directory of the binaries this test suite built>:$PATH`;
//! - the operator walkthrough's placeholders in capitals are filled from the server's state just
//!   before the line that names them runs (`OLD_KEY_ID`: the intermediate that was active when
//!   the section began; `NEW_KEY_ID`: the prepared intermediate, else the active one; `SERIAL`:
//!   the newest unrevoked certificate of the SPIFFE ID the block lists); so those blocks run
//!   line by line, each line a `bash -euo pipefail -c`.
//!
//! The walkthrough uses the default ports (gRPC 8443, HTTP 8080, the agent's 8081) and
//! `./signet-data` in a fresh temp dir. No other test binds them (they all listen on port 0), and
//! the two tests that start the walkthrough's server take one lock file in the temp directory
//! so they do not meet each other under nextest. Every process a block leaves in the
//! background (the server, the agent) is in the block's process group, which is killed when
//! the test ends, failed or not.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use signet_tests::bin;

/// How long one block (or one line) may take before the test gives up.
const BLOCK_TIMEOUT: Duration = Duration::from_secs(90);

const WALKTHROUGH: &str = "From an empty machine to a workload holding a certificate";
const OPERATOR_WALKTHROUGH: &str = "Operator walkthrough: rotation, compromise, revocation";
const CA_HIERARCHY: &str = "CA hierarchy and rotation";
const SIGNETCTL: &str = "Operating it: `signetctl`";
const JWT_LEDGER: &str = "JWT-SVIDs on the ledger";
const FEDERATION: &str = "Federation: trusting other trust domains";
const DAILY_CHECKS: &str = "Daily checks";
const RESTORE_DRILL: &str = "A restore drill";

/// The sections whose `sh` blocks these tests run or check.
const TESTED: [&str; 8] = [
    WALKTHROUGH,
    OPERATOR_WALKTHROUGH,
    CA_HIERARCHY,
    SIGNETCTL,
    JWT_LEDGER,
    FEDERATION,
    DAILY_CHECKS,
    RESTORE_DRILL,
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Run,
    Synopsis,
    NotRun,
}

#[derive(Debug, Clone)]
struct Block {
    /// The document, relative to the repository (`README.md`, `docs/operations.md`).
    file: String,
    /// 1-based line of the opening fence.
    line: usize,
    info: String,
    body: String,
}

impl Block {
    /// `None` for a block that is not shell (toml, text, json …).
    fn kind(&self) -> Option<Kind> {
        let info = self.info.trim();
        let rest = info.strip_prefix("sh")?;
        if !(rest.is_empty() || rest.starts_with(' ')) {
            return None;
        }
        let rest = rest.trim();
        if rest.is_empty() {
            Some(Kind::Run)
        } else if rest == r#"title="synopsis""# {
            Some(Kind::Synopsis)
        } else if rest.starts_with(r#"title="not run: "#) && rest.ends_with('"') {
            Some(Kind::NotRun)
        } else {
            panic!(
                "{}:{}: unknown fence marker {info:?} (sh, sh title=\"synopsis\" or sh \
                 title=\"not run: why\")",
                self.file, self.line
            )
        }
    }
}

/// The documents whose blocks these tests know: README.md, then docs/*.md by name, as
/// (path relative to the repository, text).
fn documents() -> Vec<(String, String)> {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut names = vec!["README.md".to_owned()];
    let mut docs: Vec<String> = std::fs::read_dir(repo.join("docs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".md"))
        .map(|n| format!("docs/{n}"))
        .collect();
    docs.sort();
    names.extend(docs);
    names
        .into_iter()
        .map(|n| {
            let p = repo.join(&n);
            let text =
                std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            (n, text)
        })
        .collect()
}

/// A markdown heading's level and text (`## Title` -> (2, "Title")), outside code fences.
fn heading(line: &str) -> Option<(usize, &str)> {
    let level = line.chars().take_while(|c| *c == '#').count();
    let text = line[level..].strip_prefix(' ')?;
    (level > 0).then_some((level, text.trim()))
}

/// Every fenced block of `md` (the document `file`), in order.
fn blocks(file: &str, md: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<Block> = None;
    for (i, line) in md.lines().enumerate() {
        match open.take() {
            Some(b) if line.trim_end() == "```" => out.push(b),
            Some(mut b) => {
                b.body.push_str(line);
                b.body.push('\n');
                open = Some(b);
            }
            None => {
                open = line.strip_prefix("```").map(|info| Block {
                    file: file.to_owned(),
                    line: i + 1,
                    info: info.to_owned(),
                    body: String::new(),
                })
            }
        }
    }
    assert!(open.is_none(), "{file}: a code fence is never closed");
    out
}

/// The `sh` blocks of the section titled `title` in the one document that has it.
fn section(title: &str) -> Vec<Block> {
    let found: Vec<Vec<Block>> = documents()
        .iter()
        .filter_map(|(file, md)| section_in(file, md, title))
        .collect();
    match <[Vec<Block>; 1]>::try_from(found) {
        Ok([blocks]) => blocks,
        Err(found) => panic!(
            "the section {title:?} must be in exactly one of README.md and docs/*.md; found in {}",
            found.len()
        ),
    }
}

/// The `sh` blocks of the section titled `title` (a `#` heading and its sub-headings, or a
/// bold paragraph lead) of `md`, in order; `None` when `md` has no such section.
fn section_in(file: &str, md: &str, title: &str) -> Option<Vec<Block>> {
    let lines: Vec<&str> = md.lines().collect();
    let mut in_fence = false;
    let mut level = None;
    let mut start = None;
    let mut end = lines.len();
    for (i, line) in lines.iter().enumerate() {
        if line.starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if in_fence {
            continue;
        }
        match (start, heading(line)) {
            (None, Some((l, text))) if text == title => {
                start = Some(i);
                level = Some(l);
            }
            (None, None) if line.starts_with(&format!("**{title}**")) => {
                start = Some(i);
            }
            (Some(_), Some((l, _))) if level.is_none_or(|lv| l <= lv) => {
                end = i;
                break;
            }
            (Some(_), None) if level.is_none() && line.starts_with("**") => {
                end = i;
                break;
            }
            _ => {}
        }
    }
    let start = start?;
    let text: String = lines[start..end].iter().map(|l| format!("{l}\n")).collect();
    let found = blocks(file, &text)
        .into_iter()
        .map(|mut b| {
            b.line += start;
            b
        })
        .filter(|b| b.kind().is_some())
        .collect();
    Some(found)
}

/// A fresh directory to run in (the "empty machine"), beside one for the logs, and the
/// process groups of every shell started there, killed on drop.
struct Machine {
    _root: tempfile::TempDir,
    work: PathBuf,
    logs: PathBuf,
    groups: Vec<u32>,
    runs: usize,
    _lock: Option<std::fs::File>,
}

impl Machine {
    fn new() -> Self {
        let root = tempfile::tempdir().unwrap();
        let work = root.path().join("machine");
        let logs = root.path().join("logs");
        std::fs::create_dir(&work).unwrap();
        std::fs::create_dir(&logs).unwrap();
        Self {
            _root: root,
            work,
            logs,
            groups: Vec::new(),
            runs: 0,
            _lock: None,
        }
    }

    /// Waits for, then holds until drop, the one lock of the tests that use the walkthrough's
    /// fixed ports.
    fn with_default_ports(mut self) -> Self {
        let f =
            std::fs::File::create(std::env::temp_dir().join("signet-readme-ports.lock")).unwrap();
        f.lock().unwrap();
        self._lock = Some(f);
        self
    }

    /// Runs `script` with `bash -euo pipefail` in the machine's directory, in a process group
    /// of its own, with the built binaries first on PATH and no SIGNET_* variable of the test
    /// environment. Returns (stdout, stderr); panics, with both, unless it exits 0 in time.
    fn run(&mut self, what: &str, script: &str) -> (String, String) {
        self.runs += 1;
        let n = self.runs;
        let script_path = self.logs.join(format!("{n}.sh"));
        std::fs::write(&script_path, script).unwrap();
        let out_path = self.logs.join(format!("{n}.out"));
        let err_path = self.logs.join(format!("{n}.err"));
        let bins = bin("signet-server").parent().unwrap().to_owned();
        let path = format!(
            "{}:{}",
            bins.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let mut cmd = Command::new("bash");
        cmd.arg("-euo")
            .arg("pipefail")
            .arg(&script_path)
            .current_dir(&self.work)
            .env("PATH", path)
            .stdin(Stdio::null())
            // Files, not pipes: the background jobs keep them open after the shell exits.
            .stdout(std::fs::File::create(&out_path).unwrap())
            .stderr(std::fs::File::create(&err_path).unwrap())
            .process_group(0);
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("SIGNET_") {
                cmd.env_remove(k);
            }
        }
        let mut child = cmd.spawn().unwrap();
        self.groups.push(child.id());
        let deadline = Instant::now() + BLOCK_TIMEOUT;
        let status = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break Some(st);
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let out = std::fs::read_to_string(&out_path).unwrap_or_default();
        let err = std::fs::read_to_string(&err_path).unwrap_or_default();
        match status {
            Some(st) if st.success() => (out, err),
            st => panic!(
                "{what} failed ({st:?}, timeout {BLOCK_TIMEOUT:?}):\n--- script\n{script}\n\
                 --- stdout\n{out}\n--- stderr\n{err}"
            ),
        }
    }

    /// `signetctl ARGS` (with `--json`) against the walkthrough's server (its default admin
    /// socket), parsed.
    fn signetctl_json(&self, args: &[&str]) -> serde_json::Value {
        let out = Command::new(bin("signetctl"))
            .args(args)
            .current_dir(&self.work)
            .env_remove("SIGNET_ADMIN_SOCKET")
            .output()
            .unwrap();
        assert!(out.status.success(), "signetctl {args:?}: {out:?}");
        // One document, or (lists) one per line: the latter as an array.
        let mut docs: Vec<serde_json::Value> = serde_json::Deserializer::from_slice(&out.stdout)
            .into_iter()
            .collect::<Result<_, _>>()
            .unwrap();
        if docs.len() == 1 && !args.contains(&"list") {
            docs.remove(0)
        } else {
            serde_json::Value::Array(docs)
        }
    }

    /// The serial of the newest unrevoked certificate of `id`, waiting (the agent may be
    /// replacing one that was just revoked) up to 20 s.
    fn live_serial(&self, id: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let certs = self.signetctl_json(&["certs", "list", "--json", "--spiffe-id", id]);
            let live = certs
                .as_array()
                .into_iter()
                .flatten()
                .filter(|c| c["revoked_at"].is_null())
                .max_by_key(|c| c["seq"].as_u64())
                .map(|c| c["serial"].as_str().unwrap().to_owned());
            match live {
                Some(s) => return s,
                None if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(200)),
                None => panic!("no live certificate of {id}: {certs}"),
            }
        }
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        let alive = |g: u32| {
            Command::new("kill")
                .args(["-0", "--", &format!("-{g}")])
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        for &g in &self.groups {
            let _ = Command::new("kill")
                .args(["-TERM", "--", &format!("-{g}")])
                .stderr(Stdio::null())
                .status();
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while self.groups.iter().any(|&g| alive(g)) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        for &g in &self.groups {
            let _ = Command::new("kill")
                .args(["-KILL", "--", &format!("-{g}")])
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// The walkthrough's block with its first line (the build) replaced by a PATH to the binaries
/// this test suite built ([`Machine::run`] puts them first on PATH).
fn walkthrough_script() -> String {
    let blocks = section(WALKTHROUGH);
    let [block] = blocks.as_slice() else {
        panic!("the walkthrough has one sh block: {blocks:?}")
    };
    assert_eq!(block.kind(), Some(Kind::Run), "{block:?}");
    let (first, rest) = block.body.split_once('\n').unwrap();
    assert!(
        first.starts_with("cargo build --release --bins && export PATH="),
        "{}:{}: the walkthrough's first line is the build (the test replaces it): {first}",
        block.file,
        block.line + 1
    );
    rest.to_owned()
}

/// Runs the walkthrough in `m` and checks what it leaves: openssl's OK and the files.
fn run_walkthrough(m: &mut Machine) {
    let (out, _) = m.run(WALKTHROUGH, &walkthrough_script());
    assert!(
        out.lines().any(|l| l == "web-tls/tls.crt: OK"),
        "openssl verify did not print OK: {out}"
    );
    for f in ["tls.crt", "tls.key", "ca.crt"] {
        assert!(m.work.join("web-tls").join(f).exists(), "web-tls/{f}");
    }
    let mode = std::fs::metadata(m.work.join("web-tls/tls.key"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "tls.key mode {mode:o}");
    let chain = std::fs::read_to_string(m.work.join("web-tls/tls.crt")).unwrap();
    assert_eq!(
        chain.matches("-----BEGIN CERTIFICATE-----").count(),
        2,
        "tls.crt: leaf and intermediate"
    );
}

#[test]
fn walkthrough_from_an_empty_machine() {
    let mut m = Machine::new().with_default_ports();
    run_walkthrough(&mut m);
}

/// The key ID of the intermediate in `state`, from `signetctl ca status --json`.
fn intermediate_in(status: &serde_json::Value, state: &str) -> Option<String> {
    status["slots"].as_array()?.iter().find_map(|s| {
        (s["kind"] == "intermediate" && s["state"] == state)
            .then(|| s["key_id"].as_str().unwrap().to_owned())
    })
}

/// The operator walkthrough's blocks, after the walkthrough (its server, agent and names), each
/// line run as written but for the placeholders (see the module doc).
#[test]
fn operator_walkthrough_rotation_compromise_revocation() {
    let blocks = section(OPERATOR_WALKTHROUGH);
    let runs: Vec<&Block> = blocks
        .iter()
        .filter(|b| b.kind() == Some(Kind::Run))
        .collect();
    assert!(runs.len() >= 3, "{blocks:?}");
    let mut m = Machine::new().with_default_ports();
    run_walkthrough(&mut m);
    let status = m.signetctl_json(&["ca", "status", "--json"]);
    let old_key_id = intermediate_in(&status, "active").expect("an active intermediate");
    for b in runs {
        let mut lines = b.body.lines().enumerate().peekable();
        while let Some((i, line)) = lines.next() {
            let mut line = line.to_owned();
            while line.ends_with('\\')
                && let Some((_, next)) = lines.next()
            {
                line.push('\n');
                line.push_str(next);
            }
            let command = line.split(" # ").next().unwrap_or("").trim();
            if command.is_empty() || command.starts_with('#') {
                continue;
            }
            let mut filled = line.clone();
            if filled.contains("OLD_KEY_ID") {
                filled = filled.replace("OLD_KEY_ID", &old_key_id);
            }
            if filled.contains("NEW_KEY_ID") {
                let s = m.signetctl_json(&["ca", "status", "--json"]);
                let new = intermediate_in(&s, "prepared")
                    .or_else(|| intermediate_in(&s, "active"))
                    .unwrap();
                assert_ne!(new, old_key_id);
                filled = filled.replace("NEW_KEY_ID", &new);
            }
            if filled.contains("SERIAL") {
                let id = line
                    .split_whitespace()
                    .find(|w| w.starts_with("spiffe://"))
                    .map(str::to_owned)
                    .or_else(|| previous_spiffe_id(&b.body))
                    .expect("a SPIFFE ID in the block");
                let serial = m.live_serial(&id);
                filled = filled.replace("SERIAL", &serial);
            }
            let unknown: Vec<&str> = filled
                .split(" # ")
                .next()
                .unwrap_or("")
                .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .filter(|w| w.len() > 2 && w.chars().all(|c| c.is_ascii_uppercase() || c == '_'))
                .collect();
            assert!(
                unknown.is_empty(),
                "{}:{}: placeholders this test cannot fill: {unknown:?}",
                b.file,
                b.line + 1 + i
            );
            m.run(&format!("{}:{}", b.file, b.line + 1 + i), &filled);
        }
    }
}

/// The last SPIFFE ID a block names before its `SERIAL` line (`certs list --spiffe-id …`).
fn previous_spiffe_id(body: &str) -> Option<String> {
    let before = body.split("SERIAL").next()?;
    before
        .split_whitespace()
        .rfind(|w| w.starts_with("spiffe://"))
        .map(str::to_owned)
}

/// The `signetctl` usage lines of a synopsis block: each line's subcommand path (with `a|b`
/// alternatives expanded) and the flags it names, outside its comment.
fn synopsis_lines(b: &Block) -> Vec<(Vec<String>, Vec<String>)> {
    let mut out = Vec::new();
    for (i, line) in b.body.lines().enumerate() {
        let text = line.split(" #").next().unwrap_or("").trim();
        if text.is_empty() || text.starts_with('#') {
            continue;
        }
        let words: Vec<&str> = text.split_whitespace().collect();
        assert_eq!(
            words[0],
            "signetctl",
            "{}:{}: a synopsis line is a signetctl command",
            b.file,
            b.line + 1 + i
        );
        let mut paths: Vec<Vec<String>> = vec![Vec::new()];
        let mut rest = &words[1..];
        while let Some((w, tail)) = rest.split_first()
            && w.split('|')
                .all(|a| !a.is_empty() && a.chars().all(|c| c.is_ascii_lowercase() || c == '-'))
            && !w.starts_with('-')
        {
            paths = paths
                .iter()
                .flat_map(|p| {
                    w.split('|').map(move |a| {
                        let mut p = p.clone();
                        p.push(a.to_owned());
                        p
                    })
                })
                .collect();
            rest = tail;
        }
        let flags: Vec<String> = rest
            .iter()
            .flat_map(|w| w.split('|'))
            .map(|w| w.trim_matches(|c| c == '[' || c == ']'))
            .filter(|w| w.starts_with('-'))
            .map(str::to_owned)
            .collect();
        for p in paths {
            out.push((p, flags.clone()));
        }
    }
    out
}

/// Checks every line of the section's synopsis blocks against `signetctl … --help`.
fn check_synopsis(title: &str) {
    let blocks = section(title);
    let synopses: Vec<&Block> = blocks
        .iter()
        .filter(|b| b.kind() == Some(Kind::Synopsis))
        .collect();
    assert!(!synopses.is_empty(), "{title}: no synopsis block");
    let mut failures = Vec::new();
    let mut checked = 0;
    for b in synopses {
        for (path, flags) in synopsis_lines(b) {
            let out = Command::new(bin("signetctl"))
                .args(&path)
                .arg("--help")
                .env_remove("SIGNET_ADMIN_SOCKET")
                .output()
                .unwrap();
            let help = String::from_utf8_lossy(&out.stdout);
            if !out.status.success() {
                failures.push(format!(
                    "signetctl {}: no such command ({})",
                    path.join(" "),
                    String::from_utf8_lossy(&out.stderr).trim()
                ));
                continue;
            }
            for f in &flags {
                let found = help.match_indices(f.as_str()).any(|(at, _)| {
                    let next = help[at + f.len()..].chars().next();
                    !next.is_some_and(|c| c.is_ascii_alphanumeric() || c == '-')
                });
                if !found {
                    failures.push(format!("signetctl {}: no flag {f}", path.join(" ")));
                }
            }
            checked += 1;
        }
    }
    assert!(checked > 0);
    assert!(
        failures.is_empty(),
        "{title}: the documentation names what signetctl does not have:\n{}",
        failures.join("\n")
    );
}

#[test]
fn ca_hierarchy_and_rotation_synopsis_matches_signetctl() {
    check_synopsis(CA_HIERARCHY);
}

#[test]
fn signetctl_reference_matches_signetctl() {
    check_synopsis(SIGNETCTL);
}

#[test]
fn jwt_svids_on_the_ledger_synopsis_matches_signetctl() {
    check_synopsis(JWT_LEDGER);
}

#[test]
fn federation_synopsis_matches_signetctl() {
    check_synopsis(FEDERATION);
}

/// Every `sh` block of README.md and docs/*.md is run or checked by a test here, or says why
/// not.
#[test]
fn every_sh_block_is_run_checked_or_marked() {
    let tested: Vec<(String, usize)> = TESTED
        .iter()
        .flat_map(|t| section(t))
        .filter(|b| b.kind() != Some(Kind::NotRun))
        .map(|b| (b.file, b.line))
        .collect();
    let mut seen = 0;
    for (file, md) in documents() {
        for b in blocks(&file, &md) {
            let Some(kind) = b.kind() else { continue };
            seen += 1;
            assert!(
                kind == Kind::NotRun || tested.contains(&(b.file.clone(), b.line)),
                "{}:{}: a sh block that no test in readme.rs runs: run it there or mark it \
                 ```sh title=\"not run: why\"",
                b.file,
                b.line
            );
        }
    }
    assert!(seen >= 5, "found {seen} sh blocks");
}

/// The operator guide's daily checks, then its restore drill (a second server on a copy of the
/// first one's database and keys), after the walkthrough: each block run as written.
#[test]
fn daily_checks_and_a_restore_drill() {
    let mut m = Machine::new().with_default_ports();
    run_walkthrough(&mut m);
    for title in [DAILY_CHECKS, RESTORE_DRILL] {
        let blocks = section(title);
        let runs: Vec<&Block> = blocks
            .iter()
            .filter(|b| b.kind() == Some(Kind::Run))
            .collect();
        assert_eq!(runs.len(), 1, "{title}: one block to run: {blocks:?}");
        let b = runs[0];
        let (out, err) = m.run(&format!("{}:{}", b.file, b.line), &b.body);
        match title {
            DAILY_CHECKS => assert!(out.starts_with("ready"), "readyz: {out}\n{err}"),
            _ => assert!(
                out.contains("same roots: relying parties trust the restored CA"),
                "{out}\n{err}"
            ),
        }
    }
}

/// GitHub's anchor for a heading: lower case, spaces to `-`, punctuation dropped.
fn anchor(heading: &str) -> String {
    heading
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of `md`'s headings (outside code fences).
fn anchors(md: &str) -> Vec<String> {
    let mut in_fence = false;
    let mut out = Vec::new();
    for line in md.lines() {
        if line.starts_with("```") {
            in_fence = !in_fence;
        } else if !in_fence && let Some((_, text)) = heading(line) {
            out.push(anchor(text));
        }
    }
    out
}

/// Every relative link of README.md and docs/*.md names a file of the repository, and an anchor
/// its target has (a moved section leaves no dead link behind).
#[test]
fn every_relative_link_resolves() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let docs = documents();
    let mut dead = Vec::new();
    let mut checked = 0;
    for (file, md) in &docs {
        let dir = Path::new(file).parent().unwrap_or(Path::new(""));
        let mut in_fence = false;
        for (i, line) in md.lines().enumerate() {
            if line.starts_with("```") {
                in_fence = !in_fence;
            }
            if in_fence {
                continue;
            }
            for (at, _) in line.match_indices("](") {
                let rest = &line[at + 2..];
                let Some(end) = rest.find(')') else { continue };
                let target = &rest[..end];
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                let (path, frag) = target.split_once('#').unwrap_or((target, ""));
                let resolved = if path.is_empty() {
                    PathBuf::from(file)
                } else {
                    dir.join(path)
                };
                let full = repo.join(&resolved);
                checked += 1;
                if !full.exists() {
                    dead.push(format!("{file}:{}: {target}: no such file", i + 1));
                    continue;
                }
                if !frag.is_empty() && full.extension().is_some_and(|e| e == "md") {
                    let text = std::fs::read_to_string(&full).unwrap();
                    if !anchors(&text).iter().any(|a| a == frag) {
                        dead.push(format!("{file}:{}: {target}: no such heading", i + 1));
                    }
                }
            }
        }
    }
    // The alerts' runbook links (deploy/monitoring/alerts.yaml) point into docs/ as well.
    let alerts = std::fs::read_to_string(repo.join("deploy/monitoring/alerts.yaml")).unwrap();
    for (i, line) in alerts.lines().enumerate() {
        let Some(url) = line.trim().strip_prefix("runbook_url:") else {
            continue;
        };
        let url = url.trim().trim_matches('"');
        let (path, frag) = url.split_once('#').unwrap_or((url, ""));
        checked += 1;
        let text = std::fs::read_to_string(repo.join(path)).unwrap_or_default();
        if !anchors(&text).iter().any(|a| a == frag) {
            dead.push(format!(
                "deploy/monitoring/alerts.yaml:{}: {url}: no such heading",
                i + 1
            ));
        }
    }
    assert!(checked > 10, "checked {checked} links");
    assert!(dead.is_empty(), "dead links:\n{}", dead.join("\n"));
}
