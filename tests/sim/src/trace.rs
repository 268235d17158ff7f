//! [`Trace`]: what happened in one run, in order, stamped with virtual time. Its digest
//! names the run: the same seed gives the same digest on every run and machine.

use std::cell::Cell;
use std::fmt::Display;
use std::sync::{Arc, Mutex};

use tokio::time::Instant;

thread_local! {
    /// When this thread's run began, for the logs' timestamps.
    static RUN_START: Cell<Option<Instant>> = const { Cell::new(None) };
}

/// Virtual milliseconds since this thread's run began (0 before one begins): the trace's
/// own clock, so the real code's logs (`RUST_LOG`) line up with the trace.
pub fn run_ms() -> u128 {
    RUN_START.with(|s| s.get().map_or(0, |start| start.elapsed().as_millis()))
}

#[derive(Clone)]
pub struct Trace {
    lines: Arc<Mutex<Vec<String>>>,
    start: Instant,
}

impl Trace {
    /// A trace whose clock starts now (virtual time).
    pub fn begin() -> Trace {
        let start = Instant::now();
        RUN_START.with(|s| s.set(Some(start)));
        Trace {
            lines: Arc::default(),
            start,
        }
    }

    pub fn note(&self, what: impl Display) {
        let ms = self.start.elapsed().as_millis();
        self.lines().push(format!("{ms:>8} ms  {what}"));
    }

    fn lines(&self) -> std::sync::MutexGuard<'_, Vec<String>> {
        self.lines.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn take(&self) -> Vec<String> {
        self.lines().clone()
    }
}

/// The lines' digest: 64-bit FNV-1a of the lines, each ended by a newline. Stable across
/// machines and Rust releases (unlike std's hashers).
pub fn digest(lines: &[String]) -> String {
    let bytes = lines
        .iter()
        .flat_map(|l| l.bytes().chain(std::iter::once(b'\n')));
    format!("{:016x}", fnv1a(bytes))
}

fn fnv1a(bytes: impl IntoIterator<Item = u8>) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_digest_is_fnv1a_of_the_lines_in_order() {
        // The published FNV-1a 64 test vectors.
        assert_eq!(fnv1a(*b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(*b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(digest(&[]), "cbf29ce484222325");
        assert_ne!(
            digest(&["a".into(), "b".into()]),
            digest(&["b".into(), "a".into()])
        );
    }
}
