use super::*;
use http::HeaderValue;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::metrics::info::Info;

fn accept(v: &str) -> HeaderMap {
    let mut h = HeaderMap::new();
    h.insert(ACCEPT, HeaderValue::from_str(v).unwrap());
    h
}

#[test]
fn the_scrapers_accept_header_picks_the_format() {
    // Prometheus 2.x's default scrape header.
    let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;\
                      version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
    assert_eq!(negotiate(&accept(prometheus)), Format::OpenMetrics);
    assert_eq!(
        negotiate(&accept("application/openmetrics-text; version=1.0.0")),
        Format::OpenMetrics
    );
    // Prometheus with `scrape_protocols: [PrometheusText0.0.4]`, promtool, curl.
    assert_eq!(
        negotiate(&accept("text/plain;version=0.0.4;q=1,*/*;q=0.1")),
        Format::Text
    );
    assert_eq!(negotiate(&HeaderMap::new()), Format::Text);
    assert_eq!(negotiate(&accept("*/*")), Format::Text);
    // Text preferred over OpenMetrics, or OpenMetrics refused.
    assert_eq!(
        negotiate(&accept(
            "application/openmetrics-text;q=0.3,text/plain;version=0.0.4"
        )),
        Format::Text
    );
    assert_eq!(
        negotiate(&accept("application/openmetrics-text;q=0")),
        Format::Text
    );
    assert_eq!(negotiate(&accept("application/json")), Format::Text);
}

/// A registry holding one family of each kind the binaries use.
fn sample_registry() -> Registry {
    let mut r = Registry::with_prefix("signet");
    let c = Family::<Vec<(&'static str, String)>, Counter>::default();
    // (prometheus-client 0.24 does not escape label values: ours never hold `"`, `\\` or
    // a newline.)
    c.get_or_create(&vec![("reason", "a } # value".to_owned())])
        .inc();
    r.register("refusals", "Refusals by reason", c);
    let g = Gauge::<i64>::default();
    g.set(7);
    r.register("pending", "Waiting", g);
    let h = Histogram::new([0.5, 1.0]);
    h.observe(0.7);
    r.register("duration_seconds", "How long", h);
    r.register(
        "build",
        "Build",
        Info::new(vec![("version", "1".to_owned())]),
    );
    r
}

#[test]
fn the_text_format_names_counters_with_total_and_ends_without_eof() {
    let om = encode(&sample_registry(), Format::OpenMetrics);
    assert!(om.ends_with("# EOF\n"), "{om}");
    assert!(om.contains("# TYPE signet_refusals counter"), "{om}");
    let text = encode(&sample_registry(), Format::Text);
    let expected = "# HELP signet_refusals_total Refusals by reason.\n\
                    # TYPE signet_refusals_total counter\n\
                    signet_refusals_total{reason=\"a } # value\"} 1\n\
                    # HELP signet_pending Waiting.\n\
                    # TYPE signet_pending gauge\n\
                    signet_pending 7\n\
                    # HELP signet_duration_seconds How long.\n\
                    # TYPE signet_duration_seconds histogram\n\
                    signet_duration_seconds_sum 0.7\n\
                    signet_duration_seconds_count 1\n\
                    signet_duration_seconds_bucket{le=\"0.5\"} 0\n\
                    signet_duration_seconds_bucket{le=\"1.0\"} 1\n\
                    signet_duration_seconds_bucket{le=\"+Inf\"} 1\n\
                    # HELP signet_build_info Build.\n\
                    # TYPE signet_build_info gauge\n\
                    signet_build_info{version=\"1\"} 1\n";
    assert_eq!(text, expected);
}

#[test]
fn units_exemplars_and_created_samples_are_dropped() {
    let om = "# HELP a_seconds A.\n# TYPE a_seconds counter\n# UNIT a_seconds seconds\n\
              a_seconds_total{x=\"1\"} 2 # {trace=\"t\"} 1.0 123\na_seconds_created 5\n\
              # HELP b Say \\\"hi\\\".\n# TYPE b stateset\nb{b=\"x\"} 1\n# EOF\n";
    assert_eq!(
        openmetrics_to_text(om),
        "# HELP a_seconds_total A.\n# TYPE a_seconds_total counter\n\
         a_seconds_total{x=\"1\"} 2\n# HELP b Say \"hi\".\n# TYPE b untyped\nb{b=\"x\"} 1\n"
    );
}

#[test]
fn the_standard_registry_has_build_info_and_process_metrics() {
    let r = standard_registry("server", "1.2.3");
    let text = encode(&r, Format::Text);
    let rustc = env!("SIGNET_RUSTC_VERSION");
    assert!(
        text.contains(&format!(
            "signet_server_build_info{{version=\"1.2.3\",rustc=\"{rustc}\"}} 1"
        )),
        "{text}"
    );
    if cfg!(target_os = "linux") {
        for family in [
            "process_cpu_seconds_total ",
            "process_resident_memory_bytes ",
            "process_virtual_memory_bytes ",
            "process_open_fds ",
            "process_max_fds ",
            "process_start_time_seconds ",
            "process_threads ",
        ] {
            assert!(text.contains(&format!("\n{family}")), "{family}: {text}");
        }
    }
}

#[test]
fn proc_files_are_parsed() {
    // A command name with a space and a parenthesis; fields as proc(5) numbers them.
    let stat = "4242 (signet (x) y) S 1 4242 4242 0 -1 4194560 1000 0 0 0 \
                250 50 0 0 20 0 9 0 123456 987654321 2500 18446744073709551615";
    assert_eq!(
        parse_stat(stat),
        Some(Stat {
            utime: 250,
            stime: 50,
            threads: 9,
            starttime: 123456,
            vsize: 987654321,
        })
    );
    assert_eq!(parse_stat("garbage"), None);
    assert_eq!(
        parse_boot_time("cpu  1 2 3\nbtime 1700000000\nprocesses 5\n"),
        Some(1_700_000_000)
    );
    assert_eq!(
        parse_vm_rss_bytes("Name:\tx\nVmRSS:\t    2048 kB\n"),
        Some(2048 * 1024)
    );
    let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                  Max open files            1024                 524288               files\n";
    assert_eq!(parse_max_fds(limits), Some(1024));
    assert_eq!(
        parse_max_fds(
            "Max open files            unlimited            unlimited            files\n"
        ),
        None
    );
}

#[test]
fn the_collector_reads_a_proc_directory() {
    let root = std::env::temp_dir().join(format!("signet-proc-{}", std::process::id()));
    let me = root.join("self");
    std::fs::create_dir_all(me.join("fd")).unwrap();
    for fd in ["0", "1", "2"] {
        std::fs::write(me.join("fd").join(fd), "").unwrap();
    }
    std::fs::write(root.join("stat"), "btime 1000\n").unwrap();
    std::fs::write(
        me.join("stat"),
        "1 (x) S 0 0 0 0 0 0 0 0 0 0 150 50 0 0 0 0 3 0 500 4096 0",
    )
    .unwrap();
    std::fs::write(me.join("status"), "VmRSS: 4 kB\n").unwrap();
    std::fs::write(me.join("limits"), "Max open files 64 128 files\n").unwrap();
    let s = ProcessCollector::new(&me).sample();
    std::fs::remove_dir_all(&root).unwrap();
    assert_eq!(
        s,
        ProcessSample {
            cpu_seconds: Some(2.0),
            resident_bytes: Some(4096),
            virtual_bytes: Some(4096),
            open_fds: Some(3),
            max_fds: Some(64),
            start_time_seconds: Some(1005.0),
            threads: Some(3),
        }
    );
}
