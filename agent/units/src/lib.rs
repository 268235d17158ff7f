//! Sizes ("256MiB", "1.5GiB") and durations ("500ms", "10m", "14d") as people write them:
//! one grammar for each, read the same way from the agent's config file and from the
//! command line.
//!
//! Read [`parse_size`] and [`parse_duration`] first: their docs are the grammar. Each has a
//! `format_` twin whose output it reads back.
//!
//! This crate sits below every other shoal crate (the resource guard and the CLI share no
//! other): it must never depend on one, nor on an I/O crate.

#![forbid(unsafe_code)]

mod duration;
mod size;

pub use duration::{format_duration, parse_duration};
pub use size::{format_size, parse_size};

/// A size or duration that does not read. The message names the text and what is accepted;
/// callers add the config key or flag it came from.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum UnitsError {
    /// Not a size in [`parse_size`]'s grammar.
    #[error(
        "{text:?} is not a size: write a number of bytes, whole or decimal, with an optional \
         unit: KiB, MiB, GiB, TiB, PiB (or K, M, G, T, P; powers of 1024), KB, MB, GB, TB, PB \
         (powers of 1000), or B; e.g. \"4096\", \"256MiB\", \"1.5GiB\""
    )]
    NotASize {
        /// The text as given.
        text: String,
    },
    /// A size of 2^64 bytes (16 EiB) or more.
    #[error("{text:?} is too large a size (below 16EiB)")]
    SizeTooLarge {
        /// The text as given.
        text: String,
    },
    /// Not a duration in [`parse_duration`]'s grammar.
    #[error(
        "{text:?} is not a duration: write a whole number with a unit: ms, s, m (or min), h, \
         d, or a plain number of seconds; e.g. \"500ms\", \"30s\", \"10m\", \"14d\""
    )]
    NotADuration {
        /// The text as given.
        text: String,
    },
    /// A duration too long to count in seconds.
    #[error("{text:?} is too long a duration")]
    DurationTooLong {
        /// The text as given.
        text: String,
    },
}
