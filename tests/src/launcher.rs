//! Runs commands from a shell started before the test opened any file on a mount.
//!
//! A process started straight from the test inherits the test's open descriptors and
//! closes its copies at exec; the kernel sends a mount a flush for each of them, and the
//! flush of a file whose writes wait for an agent that is down waits with them. A test
//! that restarts that agent while a writer thread has a file open would then hang in
//! the exec of `dev-cluster up` until the mount gave up (`--retry-for`, 10 minutes). The
//! shell here holds no file of any mount, so what it starts holds none either, as with
//! an operator's shell.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Output, Stdio};

pub struct Launcher {
    shell: Child,
    commands: ChildStdin,
    answers: BufReader<ChildStdout>,
    /// Where each command's stdout and stderr go, to be read back.
    dir: PathBuf,
    runs: u64,
}

impl Launcher {
    /// Starts the shell; the commands' output is kept in `dir`.
    pub fn start(dir: &Path) -> Launcher {
        let mut shell = Command::new("sh")
            .arg("-c")
            .arg(r#"while IFS= read -r line; do eval "$line"; echo "exit $?"; done"#)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("start the launcher shell");
        let commands = shell.stdin.take().expect("the shell's stdin");
        let answers = BufReader::new(shell.stdout.take().expect("the shell's stdout"));
        Launcher {
            shell,
            commands,
            answers,
            dir: dir.to_path_buf(),
            runs: 0,
        }
    }

    /// Runs `program` with `args` to its end, as `Command::output` would.
    pub fn run(&mut self, program: &Path, args: &[&str]) -> Output {
        self.try_run(program, args)
            .unwrap_or_else(|e| panic!("the launcher failed to run {}: {e}", program.display()))
    }

    /// [`Launcher::run`], failing instead of panicking (for a `Drop`).
    pub fn try_run(&mut self, program: &Path, args: &[&str]) -> std::io::Result<Output> {
        if args.iter().any(|a| a.contains('\n')) {
            return Err(std::io::Error::other(
                "the launcher takes no newline in an argument",
            ));
        }
        self.runs += 1;
        let out = self.dir.join(format!("launched-{}.out", self.runs));
        let err = self.dir.join(format!("launched-{}.err", self.runs));
        let mut line = quoted(&program.to_string_lossy());
        for a in args {
            line.push(' ');
            line.push_str(&quoted(a));
        }
        line.push_str(&format!(
            " < /dev/null > {} 2> {}\n",
            quoted(&out.to_string_lossy()),
            quoted(&err.to_string_lossy())
        ));
        self.commands.write_all(line.as_bytes())?;
        self.commands.flush()?;
        let mut answer = String::new();
        self.answers.read_line(&mut answer)?;
        let code: i32 = answer
            .trim()
            .strip_prefix("exit ")
            .and_then(|c| c.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("the launcher answered {answer:?}")))?;
        let output = Output {
            status: ExitStatus::from_raw(code << 8),
            stdout: std::fs::read(&out).unwrap_or_default(),
            stderr: std::fs::read(&err).unwrap_or_default(),
        };
        let _ = std::fs::remove_file(out);
        let _ = std::fs::remove_file(err);
        Ok(output)
    }
}

impl Drop for Launcher {
    fn drop(&mut self) {
        let _ = self.shell.kill();
        let _ = self.shell.wait();
    }
}

/// `s` as one word of a POSIX shell.
fn quoted(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_launched_command_answers_as_command_output_does() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut l = Launcher::start(dir.path());
        let out = l.run(
            Path::new("sh"),
            &["-c", "echo \"it's $1\"; echo oops >&2; exit 3", "sh", "a b"],
        );
        assert_eq!(String::from_utf8_lossy(&out.stdout), "it's a b\n");
        assert_eq!(String::from_utf8_lossy(&out.stderr), "oops\n");
        assert_eq!(out.status.code(), Some(3));
        let out = l.run(Path::new("true"), &[]);
        assert!(out.status.success());
    }
}
