//! `shoal tier ...`: the cold tier's state, and sending paths to it or bringing them back.

use std::fmt::Write as _;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Subcommand;
use shoal_agent_api::{DEFAULT_SOCKET, Ino, Request, Response, SOCKET_ENV, TierMoved, TierReport};

use crate::maintenance::call;
use crate::progress;
use crate::stat::on_fuse;

#[derive(Subcommand)]
pub enum TierCmd {
    /// Bytes and files hot and cold, objects in the bucket, garbage, the mover's state.
    Status {
        #[arg(long, env = SOCKET_ENV, default_value = DEFAULT_SOCKET)]
        socket: PathBuf,
        /// Print one JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Bring PATHs (files, or directories with everything below) back to NVMe before a
    /// job reads them.
    Prefetch {
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        /// Return once the data is on NVMe (otherwise it is warmed in the background).
        #[arg(long)]
        wait: bool,
        #[arg(long, env = SOCKET_ENV, default_value = DEFAULT_SOCKET)]
        socket: PathBuf,
    },
    /// Keep PATH (a file, or a directory with everything below) on NVMe whatever the
    /// policy says.
    Pin {
        path: PathBuf,
        #[arg(long, env = SOCKET_ENV, default_value = DEFAULT_SOCKET)]
        socket: PathBuf,
    },
    /// Let PATH go cold again under the policy.
    Unpin {
        path: PathBuf,
        #[arg(long, env = SOCKET_ENV, default_value = DEFAULT_SOCKET)]
        socket: PathBuf,
    },
    /// Send PATHs (files, or directories with everything below) to the cold tier now.
    Release {
        #[arg(required = true)]
        paths: Vec<PathBuf>,
        #[arg(long, env = SOCKET_ENV, default_value = DEFAULT_SOCKET)]
        socket: PathBuf,
    },
}

impl TierCmd {
    pub fn socket_and_json(&mut self) -> (&mut PathBuf, Option<&mut bool>) {
        match self {
            TierCmd::Status { socket, json } => (socket, Some(json)),
            TierCmd::Prefetch { socket, .. }
            | TierCmd::Pin { socket, .. }
            | TierCmd::Unpin { socket, .. }
            | TierCmd::Release { socket, .. } => (socket, None),
        }
    }
}

/// The inode of a path on a shoal mount.
fn ino_of(path: &Path) -> anyhow::Result<Ino> {
    let meta = std::fs::symlink_metadata(path)
        .with_context(|| format!("cannot stat {}", path.display()))?;
    if !on_fuse(path)? {
        bail!("{} is not on a shoal mount", path.display());
    }
    Ok(meta.ino())
}

pub fn run(cmd: TierCmd) -> anyhow::Result<()> {
    match cmd {
        TierCmd::Status { socket, json } => match call(&socket, Request::TierStatus)? {
            Response::Tier(r) if json => {
                println!("{}", serde_json::to_string_pretty(&r)?);
                Ok(())
            }
            Response::Tier(r) => {
                print!("{}", render_status(&r));
                Ok(())
            }
            other => bail!("unexpected answer from the agent: {other:?}"),
        },
        TierCmd::Prefetch {
            paths,
            wait,
            socket,
        } => {
            let inos = paths.iter().map(|p| ino_of(p)).collect::<Result<_, _>>()?;
            let request = Request::TierPrefetch { inos, wait };
            let answer = if wait {
                prefetch_with_progress(&socket, request)?
            } else {
                call(&socket, request)?
            };
            match answer {
                Response::TierMoved(m) => {
                    println!("{}", render_moved("warmed onto NVMe", &m));
                    Ok(())
                }
                Response::Done(text) => {
                    println!("{text}");
                    Ok(())
                }
                other => bail!("unexpected answer from the agent: {other:?}"),
            }
        }
        TierCmd::Release { paths, socket } => {
            let inos = paths.iter().map(|p| ino_of(p)).collect::<Result<_, _>>()?;
            match call(&socket, Request::TierRelease { inos })? {
                Response::TierMoved(m) => {
                    println!("{}", render_moved("sent to the cold tier", &m));
                    Ok(())
                }
                other => bail!("unexpected answer from the agent: {other:?}"),
            }
        }
        TierCmd::Pin { path, socket } => pin(&path, &socket, true),
        TierCmd::Unpin { path, socket } => pin(&path, &socket, false),
    }
}

/// Sends the prefetch and, until it answers, shows its progress from the agent's status:
/// an indicatif bar on a terminal, a plain line every 5 s otherwise.
fn prefetch_with_progress(socket: &Path, request: Request) -> anyhow::Result<Response> {
    let sock = socket.to_owned();
    let worker = std::thread::spawn(move || call(&sock, request));
    let bar = progress::bar(1);
    let mut lines = progress::Plain::every(Duration::from_secs(5));
    let mut shown = false;
    while !worker.is_finished() {
        std::thread::sleep(Duration::from_millis(500));
        let Ok(Response::Tier(r)) = call(socket, Request::TierStatus) else {
            continue;
        };
        if r.prefetch_bytes_total == 0 {
            continue;
        }
        if bar.is_hidden() {
            if lines.due() {
                println!("{}", progress_line(&r));
            }
        } else {
            bar.set_length(r.prefetch_bytes_total);
            bar.set_position(r.prefetch_bytes_done);
            bar.set_message(prefetch_figures(&r));
            shown = true;
        }
    }
    // Left as last drawn: the answer's summary follows on the next line.
    if shown {
        bar.abandon();
    }
    worker
        .join()
        .map_err(|_| anyhow::anyhow!("the prefetch request panicked"))?
}

/// `3/10 files, 96.0 MiB/320.0 MiB warmed, 80.0 MiB/s, ETA 3s`.
fn prefetch_figures(r: &TierReport) -> String {
    let left = r.prefetch_bytes_total.saturating_sub(r.prefetch_bytes_done);
    let eta = match r.prefetch_bytes_per_sec {
        0 => "ETA -".to_owned(),
        rate => format!("ETA {}s", left.div_ceil(rate)),
    };
    format!(
        "{}/{} files, {}/{} warmed, {}/s, {eta}",
        r.prefetch_files_done,
        r.prefetch_files_total,
        mib(r.prefetch_bytes_done),
        mib(r.prefetch_bytes_total),
        mib(r.prefetch_bytes_per_sec),
    )
}

/// Off a terminal: `25%, 3/10 files, 96.0 MiB/320.0 MiB warmed, 80.0 MiB/s, ETA 3s`.
fn progress_line(r: &TierReport) -> String {
    let share = progress::percent(r.prefetch_bytes_done, r.prefetch_bytes_total);
    format!("{share}%, {}", prefetch_figures(r))
}

fn pin(path: &Path, socket: &Path, pinned: bool) -> anyhow::Result<()> {
    let ino = ino_of(path)?;
    match call(socket, Request::TierPin { ino, pinned })? {
        Response::Done(_) => {
            let what = if pinned {
                "pinned: it stays on NVMe"
            } else {
                "unpinned: the policy may send it to the cold tier"
            };
            println!("{} {what}", path.display());
            Ok(())
        }
        other => bail!("unexpected answer from the agent: {other:?}"),
    }
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1u32 << 20))
}

fn render_moved(what: &str, m: &TierMoved) -> String {
    let secs = m.millis as f64 / 1000.0;
    let rate = if secs > 0.0 {
        format!(
            ", {:.1} MiB/s",
            m.bytes as f64 / f64::from(1u32 << 20) / secs
        )
    } else {
        String::new()
    };
    format!(
        "{} files ({} stripes, {}) {what} in {secs:.1} s{rate}",
        m.files,
        m.stripes,
        mib(m.bytes)
    )
}

pub fn render_status(r: &TierReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "store     {}", r.store);
    let _ = writeln!(
        out,
        "hot       {} in {} files",
        mib(r.hot_bytes),
        r.hot_files
    );
    let _ = writeln!(
        out,
        "cold      {} in {} files ({} partly cold)",
        mib(r.cold_bytes),
        r.cold_files,
        r.partly_cold_files
    );
    let _ = writeln!(
        out,
        "moving    {} in {} files",
        mib(r.moving_bytes),
        r.moving_files
    );
    let _ = writeln!(
        out,
        "bucket    {} objects, {}; garbage {} objects, {}",
        r.objects,
        mib(r.object_bytes),
        r.garbage_objects,
        mib(r.garbage_bytes)
    );
    let store = if r.store_ok {
        "answering"
    } else {
        "NOT ANSWERING"
    };
    let _ = writeln!(out, "mover     {} (store {store})", r.mover);
    let _ = writeln!(
        out,
        "policy    cold after {}, watermarks {:.0}%/{:.0}%, NVMe fill {:.0}%",
        r.cold_after,
        r.high_watermark * 100.0,
        r.low_watermark * 100.0,
        r.fill * 100.0
    );
    let _ = writeln!(
        out,
        "traffic   {} uploaded; {} recalls, {}",
        mib(r.uploaded_bytes),
        r.recall_requests,
        mib(r.recall_bytes)
    );
    if let Some(e) = &r.last_error {
        let _ = writeln!(out, "last error {e}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefetch_progress_shows_files_bytes_rate_and_eta() {
        let r = TierReport {
            prefetch_files_total: 10,
            prefetch_files_done: 3,
            prefetch_bytes_total: 320 << 20,
            prefetch_bytes_done: 80 << 20,
            prefetch_bytes_per_sec: 80 << 20,
            ..TierReport::default()
        };
        let line = progress_line(&r);
        assert!(line.starts_with("25%, "), "{line}");
        assert!(line.contains("3/10 files"), "{line}");
        assert!(line.contains("80.0 MiB/320.0 MiB warmed"), "{line}");
        assert!(line.contains("80.0 MiB/s, ETA 3s"), "{line}");
    }

    #[test]
    fn status_names_an_outage_and_the_last_error() {
        let r = TierReport {
            store: "s3 bucket b at http://x:9000".into(),
            store_ok: false,
            mover: "backing off".into(),
            last_error: Some("the object store is unavailable: refused".into()),
            ..TierReport::default()
        };
        let text = render_status(&r);
        assert!(
            text.contains("mover     backing off (store NOT ANSWERING)"),
            "{text}"
        );
        assert!(
            text.contains("last error the object store is unavailable"),
            "{text}"
        );
    }

    /// An agent that answers a prefetch after `after`, and its status with the prefetch
    /// half done meanwhile.
    async fn prefetching_agent(listener: tokio::net::UnixListener, after: Duration) {
        use shoal_agent_api::frame::{read_frame, write_frame};
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let answer = match read_frame(&mut stream).await {
                    Ok(Some(Request::TierPrefetch { .. })) => {
                        tokio::time::sleep(after).await;
                        Response::TierMoved(TierMoved {
                            files: 2,
                            stripes: 4,
                            bytes: 16 << 20,
                            millis: 1500,
                        })
                    }
                    Ok(Some(Request::TierStatus)) => Response::Tier(Box::new(TierReport {
                        prefetch_files_total: 2,
                        prefetch_files_done: 1,
                        prefetch_bytes_total: 16 << 20,
                        prefetch_bytes_done: 8 << 20,
                        prefetch_bytes_per_sec: 8 << 20,
                        ..TierReport::default()
                    })),
                    _ => return,
                };
                let _ = write_frame(&mut stream, &answer).await;
            });
        }
    }

    /// `tier prefetch --wait` shows progress while the prefetch runs (on a terminal as a
    /// bar, here as plain lines) and returns the agent's answer.
    #[test]
    fn a_prefetch_is_followed_until_the_agent_answers() {
        let rt = tokio::runtime::Runtime::new().expect("runtime");
        let socket =
            std::env::temp_dir().join(format!("shoal-prefetching-{}.sock", std::process::id()));
        let _ = std::fs::remove_file(&socket);
        let listener = rt
            .block_on(async { tokio::net::UnixListener::bind(&socket) })
            .expect("bind");
        rt.spawn(prefetching_agent(listener, Duration::from_millis(1500)));
        let request = Request::TierPrefetch {
            inos: vec![2, 3],
            wait: true,
        };
        match prefetch_with_progress(&socket, request).expect("answered") {
            Response::TierMoved(m) => assert_eq!((m.files, m.bytes), (2, 16 << 20)),
            other => panic!("{other:?}"),
        }
        let _ = std::fs::remove_file(&socket);
    }
}
