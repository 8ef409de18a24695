//! Configuration: invalid settings are errors, not panics or silent fixes;
//! every public type prints something useful.

use offloader::{BuildError, Offloader};

/// The two numbers of a refused setting's message: "`setting` must be
/// between 1 and {max}, got {got}" or "... at most {max} ..., got {got}".
fn numbers(err: &BuildError, setting: &str) -> (usize, usize) {
    let text = err.to_string();
    assert!(text.starts_with(setting), "{text}");
    let got = text.rsplit("got ").next().and_then(|n| n.parse().ok());
    let max = text
        .split(|c: char| !c.is_ascii_digit())
        .filter(|n| !n.is_empty())
        .nth(usize::from(text.contains("between 1 and")))
        .and_then(|n| n.parse().ok());
    match (got, max) {
        (Some(got), Some(max)) => (got, max),
        _ => panic!("no numbers in {text:?}"),
    }
}

/// `(got, max)` of a refused `queue_capacity`.
fn capacity_refused(err: &BuildError) -> (usize, usize) {
    numbers(err, "queue_capacity must be between 1 and ")
}

/// `(got, max)` of a refused `max_in_flight`.
fn in_flight_refused(err: &BuildError) -> (usize, usize) {
    numbers(err, "max_in_flight must be at most ")
}

#[test]
fn zero_in_flight_is_refused() {
    let err = Offloader::builder().max_in_flight(0).build().unwrap_err();
    assert_eq!(err.to_string(), "max_in_flight must be at least 1, got 0");
}

#[test]
fn queue_capacity_must_be_positive_and_bounded() {
    for bad in [0, usize::MAX] {
        let err = Offloader::builder()
            .queue_capacity(bad)
            .build()
            .unwrap_err();
        let (got, max) = capacity_refused(&err);
        assert_eq!(got, bad);
        assert!(
            max >= 1 << 30,
            "the limit is far beyond any real queue: {max}"
        );
    }
    // The extremes that are valid build.
    assert!(Offloader::builder().queue_capacity(1).build().is_ok());
    let max = match Offloader::builder().queue_capacity(usize::MAX).build() {
        Err(err) => capacity_refused(&err).1,
        other => panic!("unexpected {other:?}"),
    };
    assert!(Offloader::builder().queue_capacity(max).build().is_ok());
    assert!(Offloader::builder()
        .queue_capacity(max + 1)
        .build()
        .is_err());
    // Both limits checked independently: a bad capacity with a good limit,
    // and a good capacity with a bad limit.
    assert!(Offloader::builder()
        .max_in_flight(4)
        .queue_capacity(0)
        .build()
        .is_err());
    assert!(Offloader::builder()
        .max_in_flight(0)
        .queue_capacity(4)
        .build()
        .is_err());
}

/// The largest `max_in_flight` builds; one more is refused, naming both
/// (kills the mutant of `Config::validate` that refused the largest:
/// mutation testing of config.rs).
#[test]
fn the_largest_in_flight_limit_builds_and_one_more_is_refused() {
    let max = match Offloader::builder().max_in_flight(usize::MAX).build() {
        Err(err) => {
            let (got, max) = in_flight_refused(&err);
            assert_eq!(got, usize::MAX);
            max
        }
        other => panic!("unexpected {other:?}"),
    };
    assert!(max >= 1 << 16, "far beyond any real pool: {max}");
    let pool = Offloader::builder().max_in_flight(max).build();
    assert!(pool.is_ok(), "{pool:?}");
    match Offloader::builder().max_in_flight(max + 1).build() {
        Err(err) => assert_eq!(in_flight_refused(&err).0, max + 1),
        other => panic!("unexpected {other:?}"),
    }
}

#[test]
fn the_defaults_build() {
    let pool = Offloader::builder().build().expect("defaults are valid");
    let shown = format!("{pool:?}");
    assert!(shown.contains("max_in_flight: 64"), "{shown}");
    assert!(shown.contains("queue_capacity: 4096"), "{shown}");
    assert!(shown.contains("accepted: 0"), "{shown}");
    assert_eq!(offloader::DEFAULT_MAX_IN_FLIGHT, 64);
    assert_eq!(offloader::DEFAULT_QUEUE_CAPACITY, 4096);
}

/// A builder prints its settings; an observer shows as one, not as the
/// user's type (which need not be `Debug`).
#[test]
fn a_builder_prints_its_settings_and_an_observer_by_name() {
    struct Quiet;
    impl offloader::Observer for Quiet {
        fn on_event(&self, _event: &offloader::JobEvent) {}
    }
    let plain = format!("{:?}", Offloader::builder().max_in_flight(3));
    assert!(plain.contains("max_in_flight: 3"), "{plain}");
    assert!(plain.contains("observer: None"), "{plain}");
    let observed = format!(
        "{:?}",
        Offloader::builder().observer(std::sync::Arc::new(Quiet))
    );
    assert!(observed.contains("observer: Some(Observer)"), "{observed}");
}
