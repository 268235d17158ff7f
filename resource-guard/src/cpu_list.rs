//! CPU lists as the kernel writes them ("0-3,6").

use std::collections::BTreeSet;
use std::fmt;

/// A set of CPU numbers, written as the kernel writes them ("0-3,6").
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct CpuList(pub BTreeSet<u32>);

impl CpuList {
    pub fn parse(text: &str) -> Option<Self> {
        let mut set = BTreeSet::new();
        for part in text
            .trim()
            .split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
        {
            match part.split_once('-') {
                Some((a, b)) => {
                    let (a, b): (u32, u32) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
                    if a > b || b - a > 65_536 {
                        return None;
                    }
                    set.extend(a..=b);
                }
                None => {
                    set.insert(part.parse().ok()?);
                }
            }
        }
        Some(CpuList(set))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Display for CpuList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut iter = self.0.iter().copied().peekable();
        while let Some(start) = iter.next() {
            let mut end = start;
            while iter.peek() == Some(&(end + 1)) {
                end += 1;
                iter.next();
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if start == end {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_round_trip_in_kernel_form() {
        let l = CpuList::parse("0-3, 6,8-9").expect("parse");
        assert_eq!(l.len(), 7);
        assert_eq!(l.to_string(), "0-3,6,8-9");
        assert_eq!(CpuList::parse("5").expect("parse").to_string(), "5");
        for bad in ["3-1", "a", "1-", "0-99999999"] {
            assert!(CpuList::parse(bad).is_none(), "{bad:?}");
        }
    }
}
