//! Replacing a small file so that a crash or power loss leaves either the old content or
//! the new, never neither, and syncing a directory: `shoal_disk`'s on the machine's
//! filesystem (the files the agent keeps outside the metadata member: its identity, the
//! scrub's progress, the log import).

use std::path::Path;

use shoal_disk::{Disk, OsDisk};

/// Replaces `path` with `bytes` durably (see [`shoal_disk::replace_file`]). The temporary
/// file is `path` with the extension `tmp`.
pub(crate) fn replace_file(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    shoal_disk::replace_file(&OsDisk, path, bytes)
}

/// Makes the entries of directory `dir` (files created, renamed or deleted in it) durable.
pub(crate) fn sync_dir(dir: &Path) -> std::io::Result<()> {
    OsDisk.sync_dir(dir)
}

#[cfg(test)]
mod tests {
    use std::process::Command;

    use super::replace_file;

    const HELPER: &str = "SHOAL_DURABLE_HELPER_DIR";

    /// Runs under strace (this test binary, re-run as a helper): the rename must be
    /// followed by an fsync of a descriptor opened on the directory.
    #[test]
    fn a_replaced_file_survives_power_loss_with_its_directory_entry() {
        if let Ok(dir) = std::env::var(HELPER) {
            let path = std::path::Path::new(&dir).join("snapshot.bin");
            replace_file(&path, b"old").expect("first");
            replace_file(&path, b"new").expect("second");
            return;
        }
        if Command::new("strace").arg("-V").output().is_err() {
            panic!("strace is needed for this test (tests/run-all.sh installs it)");
        }
        let dir = tempfile::tempdir().expect("tmp");
        let trace = dir.path().join("trace");
        let work = dir.path().join("work");
        std::fs::create_dir(&work).expect("mkdir");
        let exe = std::env::current_exe().expect("exe");
        let status = Command::new("strace")
            .args([
                "-f",
                "-e",
                "trace=openat,rename,renameat,renameat2,fsync,close",
            ])
            .arg("-o")
            .arg(&trace)
            .arg(&exe)
            .args([
                "--exact",
                "durable::tests::a_replaced_file_survives_power_loss_with_its_directory_entry",
                "--test-threads=1",
            ])
            .env(HELPER, &work)
            .status()
            .expect("run strace");
        assert!(status.success());
        assert_eq!(
            std::fs::read(work.join("snapshot.bin")).expect("read"),
            b"new"
        );
        let text = std::fs::read_to_string(&trace).expect("trace");
        let work = work.to_string_lossy().into_owned();
        let lines: Vec<&str> = text.lines().collect();
        let renames: Vec<usize> = (0..lines.len())
            .filter(|&i| lines[i].contains("rename") && lines[i].contains("snapshot.tmp"))
            .collect();
        assert_eq!(renames.len(), 2, "two replacements:\n{text}");
        for r in renames {
            // The directory opened after the rename, and that descriptor fsync'd.
            let fd = lines[r..]
                .iter()
                .find(|l| l.contains("openat(") && l.contains(&format!("\"{work}\"")))
                .and_then(|l| l.rsplit("= ").next())
                .map(|fd| fd.trim().to_owned())
                .unwrap_or_else(|| panic!("no open of the directory after the rename:\n{text}"));
            assert!(
                lines[r..]
                    .iter()
                    .any(|l| l.contains(&format!("fsync({fd})")) && l.ends_with("= 0")),
                "directory descriptor {fd} never fsync'd after the rename:\n{text}"
            );
        }
    }
}
