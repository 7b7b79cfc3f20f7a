//! Builds the kernel programs (`ebpf/switchyard-ebpf`) for the BPF target with the
//! nightly toolchain and bpf-linker (aya-build), into `OUT_DIR/switchyard`, which
//! the loader embeds in the agent binary.

fn main() -> anyhow::Result<()> {
    let manifest_directory = std::env::var("CARGO_MANIFEST_DIR")?;
    let programs_directory = format!("{manifest_directory}/../../ebpf/switchyard-ebpf");
    // aya-build watches the programs' crate; the shared types live next to it.
    println!("cargo:rerun-if-changed={manifest_directory}/../../ebpf/switchyard-common");
    aya_build::build_ebpf(
        [aya_build::Package {
            name: "switchyard-ebpf",
            root_dir: &programs_directory,
            ..Default::default()
        }],
        aya_build::Toolchain::default(),
    )
}
