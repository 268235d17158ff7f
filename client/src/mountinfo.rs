//! FUSE mounts as /proc/self/mountinfo lists them: whether a path is one, and its device.

use std::path::Path;

/// Whether `path` is a FUSE mountpoint (by /proc/self/mountinfo, which works for a mount
/// whose process died, where statfs fails).
pub fn is_mounted(path: &Path) -> bool {
    fuse_device(path).is_some()
}

/// The device (`major:minor`) of the FUSE filesystem mounted on `path`, the topmost when
/// several are; what names its backing device in /sys/class/bdi.
pub fn fuse_device(path: &Path) -> Option<String> {
    let text = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    fuse_device_listed(&text, path.to_str()?)
}

/// The device of the last FUSE filesystem mountinfo `text` lists on `path`.
fn fuse_device_listed(text: &str, path: &str) -> Option<String> {
    text.lines().rev().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let fields: Vec<&str> = left.split(' ').collect();
        let mount_point = unescape(fields.get(4)?);
        let fstype = right.split(' ').next().unwrap_or("");
        if mount_point != path || !(fstype == "fuse" || fstype.starts_with("fuse.")) {
            return None;
        }
        fields.get(2).map(|d| d.to_string())
    })
}

/// mountinfo writes space, tab, newline and backslash as `\ooo` octal escapes.
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                out.push(d.iter().fold(0u8, |n, c| n.wrapping_mul(8) + (c - b'0')));
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw
98 22 0:51 / /tmp/dev/node1/mnt rw,nosuid,nodev,relatime shared:50 - fuse.shoal shoal rw,user_id=0,group_id=0,default_permissions
99 22 0:52 / /tmp/my\\040dir/mnt rw shared:51 - fuse.shoal shoal rw
100 22 0:53 / /tmp/dev/node2/mnt rw shared:52 - tmpfs tmpfs rw
101 98 0:54 / /tmp/dev/node1/mnt rw shared:53 - fuse.shoal shoal rw
";

    #[test]
    fn mountinfo_finds_fuse_mounts_and_the_topmost_device_by_path() {
        let found = |p| fuse_device_listed(MOUNTINFO, p);
        assert_eq!(found("/tmp/dev/node1/mnt").as_deref(), Some("0:54"));
        assert_eq!(found("/tmp/my dir/mnt").as_deref(), Some("0:52"));
        assert_eq!(found("/tmp/dev/node2/mnt"), None);
        assert_eq!(found("/tmp/dev/node3/mnt"), None);
        assert_eq!(found("/"), None);
    }

    #[test]
    fn octal_escapes_are_decoded() {
        assert_eq!(unescape("a\\040b\\134c"), "a b\\c");
        assert_eq!(unescape("trailing\\04"), "trailing\\04");
    }
}
