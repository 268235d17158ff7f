//! `shoal cert`: the cluster CA, the shared gossip secret, and node certificates.
//!
//! Layout written by `init`: `ca.pem`, `ca.key` (0600), `cluster.key` (0600). `issue`
//! writes `node.pem` and `node.key` (0600). The agent's `[tls]` section names these files.

use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use anyhow::{Context, bail};
use rand::RngExt;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use shoal_agent_api::NODE_TLS_NAME;
use time::{Duration, OffsetDateTime};

pub const CA_CERT: &str = "ca.pem";
pub const CA_KEY: &str = "ca.key";
pub const CLUSTER_KEY: &str = "cluster.key";
pub const NODE_CERT: &str = "node.pem";
pub const NODE_KEY: &str = "node.key";

const CA_VALIDITY_DAYS: i64 = 3650;
const NODE_VALIDITY_DAYS: i64 = 825;

/// Creates a new cluster CA and gossip secret in `dir`. Refuses to overwrite an existing CA:
/// regenerating it would cut every node off the cluster.
pub fn init(dir: &Path, cluster_name: &str) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    for name in [CA_CERT, CA_KEY, CLUSTER_KEY] {
        if dir.join(name).exists() {
            bail!(
                "{} already exists; refusing to replace the cluster CA (delete it by hand to start a new cluster)",
                dir.join(name).display()
            );
        }
    }
    let key = KeyPair::generate().context("generating the CA key")?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name.push(
        DnType::CommonName,
        format!("shoal cluster CA ({cluster_name})"),
    );
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let now = OffsetDateTime::now_utc();
    params.not_before = now - Duration::days(1);
    params.not_after = now + Duration::days(CA_VALIDITY_DAYS);
    let cert = params.self_signed(&key).context("self-signing the CA")?;

    let mut secret = [0u8; 32];
    rand::rng().fill(&mut secret[..]);
    let secret_hex: String = secret.iter().map(|b| format!("{b:02x}")).collect();

    write_file(&dir.join(CA_KEY), key.serialize_pem().as_bytes(), 0o600)?;
    write_file(
        &dir.join(CLUSTER_KEY),
        format!("{secret_hex}\n").as_bytes(),
        0o600,
    )?;
    write_file(&dir.join(CA_CERT), cert.pem().as_bytes(), 0o644)?;
    Ok(())
}

/// Issues a certificate for node `name`, reachable at `ips`, signed by the CA in `ca_dir`;
/// writes it to `out`.
pub fn issue(ca_dir: &Path, name: &str, ips: &[IpAddr], out: &Path) -> anyhow::Result<()> {
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
    {
        bail!("--name {name:?}: use letters, digits, '-' and '.' only");
    }
    let read = |f: &str| {
        std::fs::read_to_string(ca_dir.join(f))
            .with_context(|| format!("cannot read {}", ca_dir.join(f).display()))
    };
    let ca_key = KeyPair::from_pem(&read(CA_KEY)?).context("CA key")?;
    let issuer = Issuer::from_ca_cert_pem(&read(CA_CERT)?, ca_key).context("CA certificate")?;

    let mut params = CertificateParams::new(vec![NODE_TLS_NAME.to_owned(), name.to_owned()])?;
    params
        .subject_alt_names
        .extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let now = OffsetDateTime::now_utc();
    params.not_before = now - Duration::days(1);
    params.not_after = now + Duration::days(NODE_VALIDITY_DAYS);
    let key = KeyPair::generate().context("generating the node key")?;
    let cert = params
        .signed_by(&key, &issuer)
        .context("signing the node certificate")?;

    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    write_file(&out.join(NODE_KEY), key.serialize_pem().as_bytes(), 0o600)?;
    write_file(&out.join(NODE_CERT), cert.pem().as_bytes(), 0o644)?;
    Ok(())
}

fn write_file(path: &Path, bytes: &[u8], mode: u32) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(mode)
        .open(&tmp)
        .with_context(|| format!("cannot write {}", tmp.display()))?;
    f.write_all(bytes)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path).with_context(|| format!("cannot write {}", path.display()))?;
    // The rename is only durable once its directory is.
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .with_context(|| format!("cannot sync {}", dir.display()))?;
    }
    Ok(())
}
