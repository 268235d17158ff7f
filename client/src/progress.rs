//! The CLI's progress bars (`drain --wait`, `tier prefetch --wait`, `bench stripes`),
//! drawn by indicatif.
//!
//! A bar hides itself off a terminal (and on a dumb one): commands then print a plain line
//! now and then instead ([`Plain`]), which is what scripts and the process tests read.

use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// `PREFIX[#####...................] MESSAGE`, 24 cells wide as the CLI always drew it.
const TEMPLATE: &str = "{prefix}[{bar:24}] {msg}";
/// `PREFIX[#####...................] 12/40 MESSAGE`: a count of like things.
const COUNT_TEMPLATE: &str = "{prefix}[{bar:24}] {pos}/{len} {msg}";

/// A bar of `len` units on stdout (where the command's answer goes), hidden off a terminal;
/// the caller sets the figures beside it as the message.
pub fn bar(len: u64) -> ProgressBar {
    ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stdout())
        .with_style(style(TEMPLATE))
}

/// A bar counting `len` things called `what` ("stripes") on stderr, for a command whose
/// stdout is its report; hidden off a terminal.
pub fn count_on_stderr(len: u64, what: &'static str) -> ProgressBar {
    ProgressBar::with_draw_target(Some(len), ProgressDrawTarget::stderr())
        .with_style(style(COUNT_TEMPLATE))
        .with_message(what)
}

fn style(template: &str) -> ProgressStyle {
    // The templates are constants, checked by a test: the fallback is never taken.
    ProgressStyle::with_template(template)
        .unwrap_or_else(|_| ProgressStyle::default_bar())
        .progress_chars("#.")
}

/// Off a terminal: whether it is time for the next plain progress line (the first at once,
/// then one every `every`).
pub struct Plain {
    every: Duration,
    last: Option<Instant>,
}

impl Plain {
    pub fn every(every: Duration) -> Plain {
        Plain { every, last: None }
    }

    /// True once per `every`; the caller prints its line then.
    pub fn due(&mut self) -> bool {
        let due = self.last.is_none_or(|at| at.elapsed() >= self.every);
        if due {
            self.last = Some(Instant::now());
        }
        due
    }
}

/// `part` of `whole` in whole percent (100 for an empty whole: nothing is left).
pub fn percent(part: u64, whole: u64) -> u64 {
    if whole == 0 {
        return 100;
    }
    (u128::from(part.min(whole)) * 100 / u128::from(whole)) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_templates_are_valid() {
        for t in [TEMPLATE, COUNT_TEMPLATE] {
            assert!(ProgressStyle::with_template(t).is_ok(), "{t}");
        }
    }

    #[test]
    fn a_plain_line_is_due_at_once_then_once_a_period() {
        let mut p = Plain::every(Duration::from_secs(3600));
        assert!(p.due());
        assert!(!p.due());
        let mut p = Plain::every(Duration::ZERO);
        assert!(p.due() && p.due());
    }

    #[test]
    fn percent_rounds_down_and_calls_nothing_to_do_done() {
        assert_eq!(percent(1, 3), 33);
        assert_eq!(percent(10, 40), 25);
        assert_eq!(percent(0, 0), 100);
        assert_eq!(percent(5, 4), 100);
        assert_eq!(percent(u64::MAX - 1, u64::MAX), 99);
    }
}
