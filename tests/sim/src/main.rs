//! `shoal-sim`: runs seeds of the simulator (see the library's docs).

fn main() -> anyhow::Result<()> {
    Ok(())
}
