//! The skeleton the two model-based tests share (`model.rs`,
//! `lanes_model.rs`): proptest's settings, the log of a case's steps, and
//! how a case fails, with its configuration, its steps and what the model
//! and the real pool each hold.

use std::fmt::Debug;

use proptest::test_runner::Config as ProptestConfig;

/// A count of cases from the environment variable `var`, if it is set.
pub(crate) fn env_cases(var: &str) -> Option<u32> {
    std::env::var(var).ok().and_then(|v| v.parse().ok())
}

/// proptest's settings for a model test: `PROPTEST_CASES` cases, else
/// `default_cases`; the failing case is printed, shrunk, and kept in no
/// regression file in the tree.
pub(crate) fn config(default_cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases: env_cases("PROPTEST_CASES").unwrap_or(default_cases),
        failure_persistence: None,
        max_shrink_iters: 200,
        ..ProptestConfig::default()
    }
}

/// The steps a case has taken, one line each, for its report.
#[derive(Default)]
pub(crate) struct Steps(Vec<String>);

impl Steps {
    /// Logs the next step.
    pub(crate) fn push(&mut self, step: impl Into<String>) {
        self.0.push(step.into());
    }

    /// Adds `more` to the last step's line (what the step found).
    pub(crate) fn note(&mut self, more: &str) {
        if let Some(last) = self.0.last_mut() {
            last.push_str(more);
        }
    }

    /// The steps, one per line, indented under a report's heading.
    pub(crate) fn lines(&self) -> String {
        self.0.join("\n    ")
    }

    /// Fails the case: what went wrong, the case's configuration, its steps,
    /// and the state of the model and of the real pool.
    #[track_caller]
    pub(crate) fn fail(&self, what: &str, cfg: &dyn Debug, model: &str, real: &str) -> ! {
        panic!(
            "{what}\n  {cfg:?}\n  steps:\n    {}\n  model: {model}\n  real: {real}",
            self.lines()
        )
    }
}

/// Fails the case (`$h.fail(..)`) with the message unless `$cond` holds.
#[allow(unused_macros)] // not every test file that has `support` fails cases
macro_rules! ensure {
    ($h:expr, $cond:expr, $($msg:tt)+) => {
        if !$cond {
            $h.fail(format!($($msg)+));
        }
    };
}

#[allow(unused_imports)]
pub(crate) use ensure;
