use super::*;

fn table(text: &str) -> ImageTable {
    ImageTable::parse(text, Path::new("images.conf")).unwrap()
}

#[test]
fn an_exact_image_maps_to_its_binary_and_others_are_unmanaged() {
    let table = table("# comment\n\nregistry.k8s.io/kube-proxy:v1.20.2 /cache/kube-proxy\n");
    assert_eq!(
        table.binary_for("registry.k8s.io/kube-proxy:v1.20.2"),
        Some(Path::new("/cache/kube-proxy"))
    );
    assert_eq!(table.binary_for("registry.k8s.io/kube-proxy:v1.21.0"), None);
    assert_eq!(table.binary_for("nginx"), None);
}

#[test]
fn a_trailing_star_matches_every_tag() {
    let table = table("switchyard/agent:* /build/switchyard-agent  # any tag\n");
    assert_eq!(
        table.binary_for("switchyard/agent:0.2.0"),
        Some(Path::new("/build/switchyard-agent"))
    );
    assert_eq!(table.binary_for("switchyard/operator:0.2.0"), None);
}

#[test]
fn a_later_line_overrides_an_earlier_one() {
    let table = table("switchyard/agent:* /old/agent\nswitchyard/agent:v2 /new/agent\n");
    assert_eq!(
        table.binary_for("switchyard/agent:v2"),
        Some(Path::new("/new/agent"))
    );
    assert_eq!(
        table.binary_for("switchyard/agent:v1"),
        Some(Path::new("/old/agent"))
    );
}

#[test]
fn malformed_lines_are_rejected_with_their_line_number() {
    let error = ImageTable::parse("a /b\nonly-one-field\n", Path::new("t.conf")).unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("failed to parse the image table t.conf, line 2"),
        "{error}"
    );
    let error = ImageTable::parse("image relative/path\n", Path::new("t.conf")).unwrap_err();
    assert!(
        error.to_string().contains("not an absolute path"),
        "{error}"
    );
}

#[test]
fn an_oci_archive_entry_names_the_archive_to_run_from() {
    let table = table(
        "ghcr.io/switchyard/switchyard-agent:* oci-archive:/images/switchyard-agent.oci.tar\n",
    );
    assert_eq!(
        table.source_for("ghcr.io/switchyard/switchyard-agent:0.1.0"),
        Some(&ImageSource::OciArchive(PathBuf::from(
            "/images/switchyard-agent.oci.tar"
        )))
    );
    assert_eq!(
        table.binary_for("ghcr.io/switchyard/switchyard-agent:0.1.0"),
        None,
        "an archive is not a binary"
    );
    let error =
        ImageTable::parse("image oci-archive:relative.tar\n", Path::new("t.conf")).unwrap_err();
    assert!(
        error.to_string().contains("not an absolute path"),
        "{error}"
    );
}
