use super::*;

const MOUNTINFO: &str = "\
22 1 0:21 / /sys rw,nosuid shared:7 - sysfs sysfs rw
35 22 0:30 / /sys/fs/bpf rw,nosuid shared:12 - bpf bpf rw,mode=700
40 1 0:40 / /var/lib/with\\040space rw - ext4 /dev/sda rw
41 1 0:41 / /host/sys rw master:7 - sysfs sysfs rw
42 41 0:41 /fs/bpf /host/sys/fs/bpf rw master:7 - sysfs sysfs rw
43 42 0:43 / /host/sys/fs/bpf rw shared:20 master:12 - bpf bpf rw
";

#[test]
fn the_mount_on_top_of_the_longest_mount_point_holds_a_path() {
    assert_eq!(
        holding_mount_propagation(MOUNTINFO, Path::new("/sys/fs/bpf/switchyard")),
        Some(Propagation {
            receives: false,
            shares: true
        })
    );
    // Two mounts on /host/sys/fs/bpf: the last one listed is on top.
    assert_eq!(
        holding_mount_propagation(MOUNTINFO, Path::new("/host/sys/fs/bpf")),
        Some(Propagation {
            receives: true,
            shares: true
        })
    );
    assert_eq!(
        holding_mount_propagation(MOUNTINFO, Path::new("/host/sys/kernel")),
        Some(Propagation {
            receives: true,
            shares: false
        })
    );
}

#[test]
fn a_mount_point_with_an_escaped_space_is_matched() {
    assert_eq!(
        unescape_mount_point("/var/lib/with\\040space"),
        "/var/lib/with space"
    );
    assert_eq!(
        holding_mount_propagation(MOUNTINFO, Path::new("/var/lib/with space/x")),
        Some(Propagation {
            receives: false,
            shares: false
        })
    );
    assert_eq!(unescape_mount_point("/a\\b"), "/a\\b");
}

#[test]
fn the_pin_root_is_sys_fs_bpf_or_the_pin_directory_s_parent() {
    assert_eq!(
        pin_root(Path::new("/sys/fs/bpf/switchyard")).expect("root"),
        Path::new("/sys/fs/bpf")
    );
    assert_eq!(
        pin_root(Path::new("/sys/fs/bpf/k8s/switchyard")).expect("root"),
        Path::new("/sys/fs/bpf")
    );
    assert_eq!(
        pin_root(Path::new("/sys/fs/bpf")).expect("root"),
        Path::new("/sys/fs/bpf")
    );
    assert_eq!(
        pin_root(Path::new("/tmp/test/bpffs/switchyard")).expect("parent"),
        Path::new("/tmp/test/bpffs")
    );
    assert!(matches!(
        pin_root(Path::new("switchyard")),
        Err(BpfFilesystemError::NoPinRoot { .. })
    ));
}

#[test]
fn the_mount_advice_names_the_mount_command_and_the_chart_value() {
    let error = BpfFilesystemError::NoParent {
        root: PathBuf::from("/nowhere/bpf"),
    };
    let message = error.to_string();
    assert!(
        message.contains("`mount -t bpf bpf /nowhere/bpf`"),
        "{message}"
    );
    assert!(
        message.contains("agent.mountBpfFilesystem=true"),
        "{message}"
    );
}

#[test]
fn sys_admin_stands_in_for_bpf_and_perfmon_but_not_net_admin() {
    let status = |mask: u64| format!("Name:\tagent\nCapEff:\t{mask:016x}\n");
    let bpf = 1u64 << 39;
    let perfmon = 1u64 << 38;
    let net_admin = 1u64 << 12;
    let sys_admin = 1u64 << 21;
    assert!(lacking_loading_capabilities(&status(bpf | perfmon | net_admin)).is_empty());
    assert!(lacking_loading_capabilities(&status(sys_admin | net_admin)).is_empty());
    assert_eq!(
        lacking_loading_capabilities(&status(sys_admin | bpf | perfmon)),
        vec![("CAP_NET_ADMIN", "load and attach TC and socket programs")]
    );
    let names = |mask| {
        lacking_loading_capabilities(&status(mask))
            .into_iter()
            .map(|(name, _)| name)
            .collect::<Vec<_>>()
    };
    assert_eq!(names(net_admin), vec!["CAP_BPF", "CAP_PERFMON"]);
    assert!(lacking_loading_capabilities("Name:\tagent\n").is_empty());
}

#[test]
fn a_directory_on_another_file_system_is_not_bpffs() {
    let directory = std::env::temp_dir();
    assert!(!is_bpf_filesystem(&directory).expect("statfs"));
    assert!(matches!(
        is_bpf_filesystem(Path::new("/nonexistent/switchyard")),
        Err(BpfFilesystemError::Inspect { .. })
    ));
}
