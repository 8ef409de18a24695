//! A pool's [`Metrics`] through the ecosystem's `metrics` facade (feature
//! `metrics`): gauges for what is true now, counters for totals, every
//! series labelled with the pool's name.
//!
//! Each field of [`Metrics`] has one line in [`series`]. The macro there
//! destructures the snapshot without `..`, so a field added to [`Metrics`]
//! does not compile until it has its line, and a unit test below checks the
//! list against the struct's `Debug` output as well.

use std::time::Duration;

use metrics::{counter, describe_counter, describe_gauge, gauge};

use crate::core::metrics::Metrics;

impl Metrics {
    /// Records this snapshot through the [`metrics`](https://docs.rs/metrics)
    /// facade, into whatever recorder the application installed (a Prometheus
    /// exporter, StatsD, OpenTelemetry, ...), with the label `pool` set to
    /// `pool`.
    ///
    /// Without a recorder it does nothing.
    ///
    /// Call it where the metrics are read: in the handler that renders a
    /// Prometheus scrape, or on a timer. Every field becomes one series:
    ///
    /// - gauges, the values of now: `offloader_queued`, `offloader_running`,
    ///   `offloader_workers`, `offloader_events_pending` and
    ///   `offloader_max_running` (the most ever running at once);
    /// - counters, totals since the pool was built, named after their field
    ///   with `_total` (`offloader_accepted_total`,
    ///   `offloader_rejected_full_total`, `offloader_completed_total`,
    ///   `offloader_callers_timed_out_total`, ...), set with
    ///   [`Counter::absolute`](https://docs.rs/metrics/0.24/metrics/struct.Counter.html#method.absolute);
    /// - the two durations as counters of microseconds:
    ///   `offloader_queue_wait_microseconds_total` and
    ///   `offloader_run_time_microseconds_total`.
    ///
    /// Give each pool its own name: two pools published under one name
    /// overwrite each other's series.
    ///
    /// ```
    /// use metrics_exporter_prometheus::PrometheusBuilder;
    ///
    /// # #[tokio::main(flavor = "current_thread")]
    /// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// // Once at startup: the process's recorder (here Prometheus, without
    /// // its own HTTP listener: your service serves the text).
    /// let prometheus = PrometheusBuilder::new().install_recorder()?;
    ///
    /// let db = offloader::Offloader::builder().max_in_flight(4).build()?;
    /// db.offload(|_stop| 1 + 1).await?;
    ///
    /// // In the handler of `GET /metrics`:
    /// db.metrics().publish("db");
    /// let text = prometheus.render();
    /// assert!(text.contains(r#"offloader_completed_total{pool="db"} 1"#));
    /// assert!(text.contains(r#"offloader_running{pool="db"} 0"#));
    /// # Ok(()) }
    /// ```
    #[cfg_attr(docsrs, doc(cfg(feature = "metrics")))]
    pub fn publish(&self, pool: &str) {
        let labels = [("pool", pool.to_owned())];
        for s in series(self) {
            match s.kind {
                Kind::Gauge => {
                    describe_gauge!(s.name, s.help);
                    gauge!(s.name, &labels).set(s.value as f64);
                }
                Kind::Counter => {
                    describe_counter!(s.name, s.help);
                    counter!(s.name, &labels).absolute(s.value);
                }
            }
        }
    }
}

/// How a series is recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A value of now, set as it is.
    Gauge,
    /// A total that only grows, set with `absolute`.
    Counter,
}

/// One field of [`Metrics`] as a named series.
#[derive(Debug)]
struct Series {
    /// The field it comes from (for the tests).
    #[cfg(test)]
    field: &'static str,
    kind: Kind,
    name: &'static str,
    /// The `# HELP` text.
    help: &'static str,
    value: u64,
}

/// A field's value as a series' value: counts as they are, durations in
/// microseconds (saturating: 584 000 years).
trait Sample {
    fn sample(self) -> u64;
}

impl Sample for u64 {
    fn sample(self) -> u64 {
        self
    }
}

impl Sample for Duration {
    fn sample(self) -> u64 {
        u64::try_from(self.as_micros()).unwrap_or(u64::MAX)
    }
}

/// `Kind field => name, help;` for each field of [`Metrics`], in the
/// struct's order. The pattern names every field and has no `..`: a field
/// missing here is a compile error.
macro_rules! each_field {
    ($m:expr; $($kind:ident $field:ident => $name:literal, $help:literal;)*) => {{
        let Metrics { $($field),* } = *$m;
        vec![$(Series {
            #[cfg(test)]
            field: stringify!($field),
            kind: Kind::$kind,
            name: $name,
            help: $help,
            value: Sample::sample($field),
        }),*]
    }};
}

/// Every field of `m` as a series: one line per field.
fn series(m: &Metrics) -> Vec<Series> {
    each_field! { m;
        Counter accepted => "offloader_accepted_total", "Jobs accepted.";
        Counter rejected_full => "offloader_rejected_full_total", "Jobs refused at once because the queue was full.";
        Counter rejected_timed_out => "offloader_rejected_timed_out_total", "Callers whose timeout passed while they waited for room; their jobs were never accepted.";
        Counter rejected_overload => "offloader_rejected_overload_total", "Jobs refused because they could not finish before their deadline behind the jobs ahead.";
        Counter rejected_shutdown => "offloader_rejected_shutdown_total", "Jobs refused because the pool was shutting down.";
        Counter rejected_spawn => "offloader_rejected_spawn_total", "Jobs refused because no worker thread could be spawned.";
        Counter rejected_observer => "offloader_rejected_observer_total", "Jobs refused because the lifecycle observer lagged.";
        Counter events_delivered => "offloader_events_delivered_total", "Lifecycle events delivered to the observer.";
        Gauge events_pending => "offloader_events_pending", "Lifecycle events not yet delivered to the observer.";
        Counter spawn_failures => "offloader_spawn_failures_total", "Worker threads the OS refused while a job was accepted anyway.";
        Gauge queued => "offloader_queued", "Accepted jobs waiting in the queue now.";
        Gauge running => "offloader_running", "Functions running now (permits held).";
        Counter completed => "offloader_completed_total", "Jobs whose function returned.";
        Counter panicked => "offloader_panicked_total", "Jobs whose function panicked.";
        Counter cancelled => "offloader_cancelled_total", "Jobs cancelled while queued; they never ran.";
        Counter unstarted => "offloader_unstarted_total", "Jobs handed back unstarted by an immediate shutdown.";
        Counter shed => "offloader_shed_total", "Jobs shed at their turn, too near their deadline to finish; they never ran.";
        Counter callers_timed_out => "offloader_callers_timed_out_total", "Callers (awaiting or holding a handle) whose timeout passed before the outcome.";
        Counter callers_dropped => "offloader_callers_dropped_total", "Callers that dropped their future, or their handle under a cancelling policy, before the outcome.";
        Counter running_after_caller_left => "offloader_running_after_caller_left_total", "Jobs that were running when their caller left.";
        Counter stop_requests => "offloader_stop_requests_total", "Stop requests that took effect, made through the pool.";
        Gauge max_running => "offloader_max_running", "The most functions ever running at the same instant.";
        Gauge workers => "offloader_workers", "Worker threads alive now.";
        Counter queue_wait_total => "offloader_queue_wait_microseconds_total", "Time accepted jobs spent queued before they started, in microseconds.";
        Counter run_time_total => "offloader_run_time_microseconds_total", "Time finished jobs' functions ran, in microseconds.";
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use metrics_exporter_prometheus::PrometheusBuilder;

    /// The field names of `Metrics`, read from its derived `Debug` output
    /// (`Metrics { accepted: 0, ..., run_time_total: 0ns }`).
    fn debug_fields() -> Vec<String> {
        let debug = format!("{:?}", Metrics::default());
        let body = debug
            .strip_prefix("Metrics { ")
            .and_then(|b| b.strip_suffix(" }"))
            .unwrap_or_else(|| panic!("unexpected Debug output: {debug}"));
        body.split(", ")
            .map(|kv| kv.split(':').next().unwrap_or_default().to_owned())
            .collect()
    }

    #[test]
    fn every_field_is_published_once_in_order() {
        let fields = debug_fields();
        assert!(fields.len() >= 22, "{fields:?}");
        let published: Vec<&str> = series(&Metrics::default())
            .iter()
            .map(|s| s.field)
            .collect();
        assert_eq!(published, fields);
    }

    #[test]
    fn names_follow_the_prometheus_conventions() {
        for s in series(&Metrics::default()) {
            assert!(s.name.starts_with("offloader_"), "{s:?}");
            match s.kind {
                Kind::Counter => assert!(s.name.ends_with("_total"), "{s:?}"),
                Kind::Gauge => assert_eq!(s.name, format!("offloader_{}", s.field), "{s:?}"),
            }
        }
        let mut names: Vec<&str> = series(&Metrics::default()).iter().map(|s| s.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), series(&Metrics::default()).len());
    }

    /// Through a real exporter: each series with its own value, its type
    /// and the pool's label.
    #[test]
    fn a_prometheus_scrape_shows_every_series_with_its_value() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        let m = Metrics {
            accepted: 7,
            rejected_full: 2,
            queued: 3,
            running: 4,
            completed: 1,
            callers_timed_out: 5,
            max_running: 4,
            workers: 4,
            queue_wait_total: Duration::from_millis(12),
            run_time_total: Duration::from_nanos(2_500),
            ..Metrics::default()
        };
        metrics::with_local_recorder(&recorder, || {
            m.publish("db");
            Metrics { running: 1, ..m }.publish("other");
        });
        let text = handle.render();
        for s in series(&m) {
            let kind = match s.kind {
                Kind::Gauge => "gauge",
                Kind::Counter => "counter",
            };
            for line in [
                format!("# TYPE {} {kind}", s.name),
                format!("# HELP {} {}", s.name, s.help),
                format!("{}{{pool=\"db\"}} {}", s.name, s.value),
            ] {
                assert!(text.lines().any(|l| l == line), "{line:?} not in:\n{text}");
            }
        }
        for line in [
            r#"offloader_queue_wait_microseconds_total{pool="db"} 12000"#,
            r#"offloader_run_time_microseconds_total{pool="db"} 2"#,
            r#"offloader_running{pool="db"} 4"#,
            r#"offloader_running{pool="other"} 1"#,
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} not in:\n{text}");
        }
    }

    #[test]
    fn durations_saturate() {
        assert_eq!(Duration::MAX.sample(), u64::MAX);
        assert_eq!(Duration::from_nanos(999).sample(), 0);
    }
}
