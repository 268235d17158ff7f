//! A real S3 server for the tiering tests: Garage (built once into the tools cache by
//! `tests/s3/install-garage.sh`), one node on 127.0.X.250 with its data in a temp dir, a
//! bucket and a key made with Garage's own CLI. It can be stopped (an outage) and started
//! again on the same data.

use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::wait_for;

/// The key and bucket every test uses (Garage accepts imported keys in this form).
pub const KEY_ID: &str = "GK0123456789abcdef01234567";
pub const SECRET: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
pub const BUCKET: &str = "shoal";
pub const REGION: &str = "garage";

pub struct Garage {
    dir: tempfile::TempDir,
    ip: Ipv4Addr,
    bin: PathBuf,
    child: Option<Child>,
}

/// The Garage binary: `SHOAL_GARAGE`, else the cache's (built on first use).
fn garage_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("SHOAL_GARAGE") {
        return PathBuf::from(p);
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("s3/install-garage.sh");
    let out = Command::new(&script)
        .stderr(Stdio::inherit())
        .output()
        .expect("run install-garage.sh");
    assert!(
        out.status.success(),
        "{} failed: Garage (the S3 server of the tiering tests) is not installed",
        script.display()
    );
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
}

impl Garage {
    /// Starts Garage on 127.0.`subnet`.250 with the bucket and key ready.
    pub fn start(subnet: u8) -> Garage {
        let dir = tempfile::Builder::new()
            .prefix("shoal-garage-")
            .tempdir()
            .expect("tempdir");
        let ip = Ipv4Addr::new(127, 0, subnet, 250);
        let config = format!(
            r#"metadata_dir = "{d}/meta"
data_dir = "{d}/data"
db_engine = "lmdb"
replication_factor = 1
rpc_bind_addr = "{ip}:3901"
rpc_public_addr = "{ip}:3901"
rpc_secret = "{SECRET}"
[s3_api]
s3_region = "{REGION}"
api_bind_addr = "{ip}:3900"
root_domain = ".s3.garage.localhost"
[admin]
api_bind_addr = "{ip}:3903"
admin_token = "shoal-test-admin"
"#,
            d = dir.path().display()
        );
        std::fs::write(dir.path().join("garage.toml"), config).expect("garage.toml");
        std::fs::write(
            dir.path().join("credentials.toml"),
            format!("access_key_id = \"{KEY_ID}\"\nsecret_access_key = \"{SECRET}\"\n"),
        )
        .expect("credentials");
        let mut g = Garage {
            dir,
            ip,
            bin: garage_bin(),
            child: None,
        };
        g.resume();
        wait_for(Duration::from_secs(30), "garage status", || {
            g.cli(&["status"]).ok()
        });
        let id = g.cli(&["node", "id", "-q"]).expect("node id");
        let id = id.split('@').next().unwrap_or_default().trim().to_owned();
        for args in [
            vec!["layout", "assign", "-z", "dc1", "-c", "1G", id.as_str()],
            vec!["layout", "apply", "--version", "1"],
            vec!["key", "import", "--yes", "-n", "shoal", KEY_ID, SECRET],
            vec!["bucket", "create", BUCKET],
            vec![
                "bucket", "allow", "--read", "--write", "--owner", BUCKET, "--key", "shoal",
            ],
        ] {
            if let Err(e) = g.cli(&args) {
                panic!("garage {}: {e}", args.join(" "));
            }
        }
        g
    }

    /// Runs `garage -c CONFIG ARGS`, its stdout or its stderr.
    fn cli(&self, args: &[&str]) -> Result<String, String> {
        let out = Command::new(&self.bin)
            .arg("-c")
            .arg(self.dir.path().join("garage.toml"))
            .args(args)
            .output()
            .map_err(|e| e.to_string())?;
        if out.status.success() {
            Ok(String::from_utf8_lossy(&out.stdout).into_owned())
        } else {
            Err(String::from_utf8_lossy(&out.stderr).into_owned())
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://{}:3900", self.ip)
    }

    pub fn credentials_file(&self) -> PathBuf {
        self.dir.path().join("credentials.toml")
    }

    /// `dev-cluster up` arguments that put the cold tier in this bucket.
    pub fn cluster_args(&self) -> Vec<String> {
        vec![
            "--tiering".into(),
            "s3".into(),
            "--s3-endpoint".into(),
            self.endpoint(),
            "--s3-region".into(),
            REGION.into(),
            "--s3-bucket".into(),
            BUCKET.into(),
            "--s3-credentials-file".into(),
            self.credentials_file().display().to_string(),
        ]
    }

    /// Stops the server at once (an outage); its data stays.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server (again) on its data and waits until the S3 port accepts.
    pub fn resume(&mut self) {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("garage.log"))
            .expect("garage.log");
        let child = Command::new(&self.bin)
            .arg("-c")
            .arg(self.dir.path().join("garage.toml"))
            .arg("server")
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("start garage");
        self.child = Some(child);
        let addr = SocketAddr::from((self.ip, 3900));
        wait_for(Duration::from_secs(30), "garage's S3 port", || {
            TcpStream::connect_timeout(&addr, Duration::from_millis(200)).ok()
        });
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("garage.log")).unwrap_or_default()
    }
}

impl Drop for Garage {
    fn drop(&mut self) {
        self.stop();
    }
}
