use super::*;

#[test]
fn the_standalone_command_line_of_the_issue_parses() {
    let cli = Cli::try_parse_from([
        "switchyard-agent",
        "standalone",
        "--manifests",
        "/etc/switchyard",
        "--pod-interfaces",
        "veth*,pod*",
        "--host-interfaces",
        "eth0",
        "--node-ip",
        "192.168.1.10",
        "--node-ip",
        "192.168.1.11",
        "--node-name",
        "node-a",
        "--bpf-pin-dir",
        "/sys/fs/bpf/test",
        "--detach-on-exit",
    ])
    .expect("parses");
    let Command::Standalone(arguments) = cli.command else {
        panic!("expected standalone");
    };
    let options = arguments.options();
    assert_eq!(options.node_ports.node_ips.len(), 2);
    assert_eq!(options.node_name, "node-a");
    assert!(options.detach_on_exit);
    assert!(options.datapath.pod_interfaces.matches("pod7"));
    assert!(options
        .datapath
        .host_interfaces
        .expect("given")
        .matches("eth0"));
    assert_eq!(
        options.datapath.pin_directory,
        PathBuf::from("/sys/fs/bpf/test")
    );
}

#[test]
fn the_run_command_line_of_the_chart_parses() {
    let cli = Cli::try_parse_from([
        "switchyard-agent",
        "run",
        "--node-name",
        "node-1",
        "--bpf-pin-dir=/sys/fs/bpf/switchyard",
        "--pod-interfaces=veth*,cali*,lxc*",
        "--metrics-address=0.0.0.0:9964",
        "--min-sync-period=1s",
        "--frontends-map-size=65536",
        "--backends-map-size=262144",
        "--conntrack-map-size=524288",
        "--conntrack-overflow-map-size=65536",
        "--pod-connect-time-load-balancing=tcp",
    ])
    .expect("parses");
    let Command::Run(arguments) = cli.command else {
        panic!("expected run");
    };
    let options = arguments.options();
    assert_eq!(options.node_name, "node-1");
    assert_eq!(
        options.datapath.pod_connect_balancing,
        PodConnectBalancing::Tcp
    );
    assert_eq!(options.min_sync_period, Duration::from_secs(1));
    assert_eq!(options.datapath.map_sizes.backend_slots, 262_144);
    assert_eq!(options.datapath.map_sizes.conntrack_overflow, 65_536);
    assert_eq!(options.datapath.host_interfaces, None);
    assert_eq!(options.gate_timeout, Duration::from_secs(30));
    assert!(options.datapath.pod_interfaces.matches("veth9"));
}

#[test]
fn kube_proxys_metrics_address_is_its_default_unless_given_and_empty_turns_it_off() {
    let address = |flag: Option<&str>| {
        let mut line = vec!["switchyard-agent", "run", "--node-name", "node-1"];
        line.extend(flag);
        Cli::try_parse_from(line).map(|cli| match cli.command {
            Command::Run(arguments) => arguments.options().kube_proxy_metrics_address,
            _ => panic!("expected run"),
        })
    };
    assert_eq!(
        address(None).expect("parses"),
        Some("127.0.0.1:10249".parse().expect("an address"))
    );
    assert_eq!(
        address(Some("--kube-proxy-metrics-address=0.0.0.0:10249")).expect("parses"),
        Some("0.0.0.0:10249".parse().expect("an address"))
    );
    assert_eq!(
        address(Some("--kube-proxy-metrics-address=")).expect("parses"),
        None
    );
    assert!(address(Some("--kube-proxy-metrics-address=10249")).is_err());
}

#[test]
fn node_port_flags_take_kube_proxys_values_and_default_to_its_1_20_iptables_mode() {
    let node_ports = |flags: &[&str]| {
        let mut line = vec!["switchyard-agent", "run", "--node-name", "node-1"];
        line.extend(flags);
        Cli::try_parse_from(line).map(|cli| match cli.command {
            Command::Run(arguments) => arguments.options().node_ports,
            _ => panic!("expected run"),
        })
    };
    let defaults = node_ports(&[]).expect("parses");
    assert_eq!(defaults.addresses, NodePortAddresses::Every);
    assert!(defaults.localhost);
    // The chart's empty value is the default too.
    assert_eq!(
        node_ports(&["--node-port-addresses="]).expect("parses"),
        defaults
    );
    let primary = node_ports(&[
        "--node-port-addresses=primary",
        "--localhost-node-ports=false",
    ])
    .expect("parses");
    assert_eq!(primary.addresses, NodePortAddresses::Primary);
    assert!(!primary.localhost);
    let Ok(ranges) = node_ports(&["--node-port-addresses=10.0.0.0/8,127.0.0.0/8"]) else {
        panic!("ranges parse");
    };
    assert!(matches!(ranges.addresses, NodePortAddresses::Ranges(ref list) if list.len() == 2));
    assert!(node_ports(&["--node-port-addresses=10.0.0.0/33"]).is_err());
    assert!(node_ports(&["--node-port-addresses=primary,10.0.0.0/8"]).is_err());
}

#[test]
fn durations_take_the_units_of_the_chart() {
    assert_eq!(parse_duration("1s"), Ok(Duration::from_secs(1)));
    assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
    assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
    assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
    assert!(parse_duration("1h").is_err());
    assert!(parse_duration("s").is_err());
}

#[test]
fn standalone_defaults_follow_the_issue() {
    let cli = Cli::try_parse_from(["switchyard-agent", "standalone", "--manifests", "m.yaml"])
        .expect("parses");
    let Command::Standalone(arguments) = cli.command else {
        panic!("expected standalone");
    };
    let options = arguments.options();
    for name in ["veth0", "cali1", "lxc2"] {
        assert!(options.datapath.pod_interfaces.matches(name), "{name}");
    }
    assert_eq!(options.datapath.host_interfaces, None);
    assert_eq!(options.node_ports, NodePortSettings::default());
    assert_eq!(
        options.datapath.pin_directory,
        PathBuf::from(DEFAULT_PIN_DIRECTORY)
    );
    assert!(!options.detach_on_exit);
    assert_eq!(
        options.datapath.map_sizes,
        crate::loader::MapSizes::default()
    );
}

#[test]
fn standalone_takes_the_map_sizes_the_run_command_takes() {
    let cli = Cli::try_parse_from([
        "switchyard-agent",
        "standalone",
        "--manifests",
        "m.yaml",
        "--frontends-map-size=131072",
        "--backends-map-size=524288",
    ])
    .expect("parses");
    let Command::Standalone(arguments) = cli.command else {
        panic!("expected standalone");
    };
    let sizes = arguments.options().datapath.map_sizes;
    assert_eq!(sizes.frontends, 131_072);
    assert_eq!(sizes.backend_slots, 524_288);
    assert_eq!(
        sizes.conntrack,
        crate::loader::MapSizes::default().conntrack
    );
}

#[test]
fn pods_tcp_connects_go_straight_to_a_backend_unless_switched_off() {
    let parse = |extra: &[&str]| {
        let mut line = vec!["switchyard-agent", "run", "--node-name", "node-1"];
        line.extend_from_slice(extra);
        match Cli::try_parse_from(line).map(|cli| cli.command) {
            Ok(Command::Run(arguments)) => Ok(arguments.options().datapath.pod_connect_balancing),
            Ok(_) => panic!("expected run"),
            Err(error) => Err(error.to_string()),
        }
    };
    assert_eq!(parse(&[]), Ok(PodConnectBalancing::Tcp));
    assert_eq!(
        parse(&["--pod-connect-time-load-balancing", "disabled"]),
        Ok(PodConnectBalancing::Disabled)
    );
    let refused = parse(&["--pod-connect-time-load-balancing", "udp"]).expect_err("refused");
    assert!(
        refused.contains("possible values: disabled, tcp"),
        "{refused}"
    );
    // What the programs read: zero (the old reserved field) is "disabled".
    assert_eq!(PodConnectBalancing::Disabled.config_value(), 0);
    assert_eq!(
        crate::datapath::datapath_config(
            switchyard_common::DATAPATH_MODE_ACTIVE,
            7,
            0x4000,
            PodConnectBalancing::Tcp
        )
        .pod_connect_balancing,
        switchyard_common::POD_CONNECT_BALANCING_TCP
    );
}

#[test]
fn only_ipv4_is_served_unless_ipv6_is_asked_for_and_ipv4_is_never_left_out() {
    let parse = |command: &str, extra: &[&str]| {
        let mut line = vec!["switchyard-agent", command];
        line.extend_from_slice(if command == "run" {
            &["--node-name", "node-1"][..]
        } else {
            &["--manifests", "/etc/switchyard"][..]
        });
        line.extend_from_slice(extra);
        match Cli::try_parse_from(line).map(|cli| cli.command) {
            Ok(Command::Run(arguments)) => Ok(arguments.options().datapath.served_families),
            Ok(Command::Standalone(arguments)) => Ok(arguments.options().datapath.served_families),
            Ok(_) => panic!("expected run or standalone"),
            Err(error) => Err(error.to_string()),
        }
    };
    for command in ["run", "standalone"] {
        assert_eq!(
            parse(command, &[]),
            Ok(ServedFamilies::IPV4_ONLY),
            "{command}"
        );
        for both in ["ipv4,ipv6", "IPv6, IPv4"] {
            assert_eq!(
                parse(command, &["--served-families", both]),
                Ok(ServedFamilies::DUAL_STACK),
                "{command} {both}"
            );
        }
        let refused = parse(command, &["--served-families", "ipv6"]).expect_err("refused");
        assert!(refused.contains("IPv4 is always served"), "{refused}");
        let refused = parse(command, &["--served-families", "ipv4,ipx"]).expect_err("refused");
        assert!(
            refused.contains("\"ipx\" is not an address family"),
            "{refused}"
        );
    }
    // The core keeps only the served families' addresses, the loader attaches the
    // IPv6 hooks only when IPv6 is served.
    let default = crate::standalone::agent_settings(&standalone_options(&[]));
    assert_eq!(default.served_families, ServedFamilies::IPV4_ONLY);
    let dual =
        crate::standalone::agent_settings(&standalone_options(&["--served-families", "ipv4,ipv6"]));
    assert_eq!(dual.served_families, ServedFamilies::DUAL_STACK);
}

fn standalone_options(extra: &[&str]) -> crate::standalone::StandaloneOptions {
    let mut line = vec![
        "switchyard-agent",
        "standalone",
        "--manifests",
        "/etc/switchyard",
    ];
    line.extend_from_slice(extra);
    match Cli::try_parse_from(line).expect("parses").command {
        Command::Standalone(arguments) => arguments.options(),
        _ => panic!("expected standalone"),
    }
}
