use super::*;

const TIMEOUT: Duration = Duration::from_secs(600);

#[test]
fn a_retried_detach_works_on_the_interfaces_left_and_a_first_one_on_every_interface() {
    let left: BTreeSet<String> = ["veth-b".to_string()].into();
    let current = [
        "veth-a".to_string(),
        "veth-b".to_string(),
        "eth0".to_string(),
    ];
    assert_eq!(
        interfaces_to_detach(Attachment::Detaching, &left, current.iter()),
        vec!["veth-b".to_string()]
    );
    assert_eq!(
        interfaces_to_detach(
            Attachment::Draining {
                since: Instant::now()
            },
            &left,
            current.iter()
        ),
        current.to_vec()
    );
}

#[test]
fn ebpf_mode_attaches_once() {
    let now = Instant::now();
    let (state, action) = follow_mode(Attachment::Detached, Mode::Ebpf, TIMEOUT, None, now);
    assert_eq!(
        (state, action),
        (Attachment::Attached, Some(ModeAction::Activate))
    );
    let (state, action) = follow_mode(state, Mode::Ebpf, TIMEOUT, None, now);
    assert_eq!((state, action), (Attachment::Attached, None));
}

#[test]
fn kube_proxy_mode_from_the_start_attaches_nothing() {
    let now = Instant::now();
    assert_eq!(
        follow_mode(Attachment::Detached, Mode::KubeProxy, TIMEOUT, Some(3), now),
        (Attachment::Detached, None)
    );
}

#[test]
fn kube_proxy_mode_after_ebpf_drains_until_the_last_flow_closes() {
    let start = Instant::now();
    let (state, action) = follow_mode(
        Attachment::Attached,
        Mode::KubeProxy,
        TIMEOUT,
        Some(5),
        start,
    );
    assert_eq!(state, Attachment::Draining { since: start });
    assert_eq!(action, Some(ModeAction::StartDraining));
    let later = start + Duration::from_secs(10);
    assert_eq!(
        follow_mode(state, Mode::KubeProxy, TIMEOUT, Some(2), later),
        (state, None)
    );
    // An unreadable flow count never detaches early.
    assert_eq!(
        follow_mode(state, Mode::KubeProxy, TIMEOUT, None, later),
        (state, None)
    );
    assert_eq!(
        follow_mode(state, Mode::KubeProxy, TIMEOUT, Some(0), later),
        (Attachment::Detached, Some(ModeAction::Detach))
    );
}

#[test]
fn draining_ends_at_the_timeout_even_with_live_flows() {
    let start = Instant::now();
    let draining = Attachment::Draining { since: start };
    assert_eq!(
        follow_mode(draining, Mode::KubeProxy, TIMEOUT, Some(9), start + TIMEOUT),
        (Attachment::Detached, Some(ModeAction::Detach))
    );
}

fn spec(mode: Mode) -> ModeSpec {
    ModeSpec::new(mode)
}

/// The instruction and what following it does to `attachment`.
fn follow(
    dataplane_node: Option<&ModeSpec>,
    last_seen: Option<&ModeSpec>,
    attachment: Attachment,
    now: Instant,
) -> (Instruction, Attachment, Option<ModeAction>) {
    let followed = instruction(dataplane_node, last_seen, attachment);
    let (next, action) = follow_mode(
        attachment,
        followed.mode(),
        followed.drain_timeout(),
        Some(4),
        now,
    );
    (followed, next, action)
}

#[test]
fn a_deleted_dataplane_node_after_ebpf_keeps_an_attached_node_serving() {
    let ebpf = spec(Mode::Ebpf);
    let (followed, next, action) = follow(None, Some(&ebpf), Attachment::Attached, Instant::now());
    assert_eq!(followed, Instruction::DataplaneNodeGone(ebpf));
    assert_eq!((next, action), (Attachment::Attached, None));
}

#[test]
fn a_node_that_never_had_a_dataplane_node_and_has_nothing_attached_follows_kube_proxy() {
    let (followed, next, action) = follow(None, None, Attachment::Detached, Instant::now());
    assert_eq!(followed, Instruction::NoDataplaneNode);
    assert_eq!(followed.mode(), Mode::KubeProxy);
    assert_eq!((next, action), (Attachment::Detached, None));
}

#[test]
fn programs_an_earlier_process_attached_keep_serving_without_a_dataplane_node() {
    let (followed, next, action) = follow(None, None, Attachment::Attached, Instant::now());
    assert_eq!(followed, Instruction::AttachedBefore(Mode::Ebpf));
    assert_eq!((next, action), (Attachment::Attached, None));
}

#[test]
fn a_drain_an_earlier_process_began_goes_on_without_a_dataplane_node() {
    let start = Instant::now();
    let draining = Attachment::Draining { since: start };
    let (followed, next, action) = follow(None, None, draining, start);
    assert_eq!(followed, Instruction::AttachedBefore(Mode::KubeProxy));
    assert_eq!((next, action), (draining, None));
}

#[test]
fn an_explicit_kube_proxy_mode_drains_an_attached_node() {
    let now = Instant::now();
    let ebpf = spec(Mode::Ebpf);
    let mut kube_proxy = spec(Mode::KubeProxy);
    kube_proxy.drain_timeout_seconds = 30;
    let (followed, next, action) =
        follow(Some(&kube_proxy), Some(&ebpf), Attachment::Attached, now);
    assert_eq!(followed.drain_timeout(), Duration::from_secs(30));
    assert_eq!(next, Attachment::Draining { since: now });
    assert_eq!(action, Some(ModeAction::StartDraining));
}

#[test]
fn a_dataplane_node_recreated_with_ebpf_continues_without_reattaching() {
    let now = Instant::now();
    let ebpf = spec(Mode::Ebpf);
    let (_, gone, action) = follow(None, Some(&ebpf), Attachment::Attached, now);
    assert_eq!((gone, action), (Attachment::Attached, None));
    let recreated = spec(Mode::Ebpf);
    let (followed, next, action) = follow(Some(&recreated), Some(&ebpf), gone, now);
    assert_eq!(followed, Instruction::DataplaneNode(recreated));
    assert_eq!((next, action), (Attachment::Attached, None));
}

fn failing_on<'a>(names: &'a [&'a str]) -> impl FnMut(&str) -> Result<(), String> + 'a {
    move |name| {
        if names.contains(&name) {
            Err(format!(
                "failed to detach from {name}: device or resource busy"
            ))
        } else {
            Ok(())
        }
    }
}

#[test]
fn a_failed_detach_leaves_the_node_detaching_with_the_interfaces_left_and_their_errors() {
    let interfaces: Vec<String> = ["eth0", "p-a", "p-b"].map(String::from).to_vec();
    let round = detach_interfaces(&interfaces, failing_on(&["p-a"]));
    assert_eq!(round.remaining, BTreeSet::from(["p-a".to_string()]));
    assert_eq!(round.attachment(), Attachment::Detaching);
    assert_eq!(
        round.error().as_deref(),
        Some("failed to detach from p-a: device or resource busy")
    );
}

#[test]
fn detaching_retries_the_interfaces_left_every_round_and_ends_detached_once_none_is() {
    let (next, action) = follow_mode(
        Attachment::Detaching,
        Mode::KubeProxy,
        TIMEOUT,
        None,
        Instant::now(),
    );
    assert_eq!(
        (next, action),
        (Attachment::Detached, Some(ModeAction::Detach))
    );
    let left = BTreeSet::from(["p-a".to_string()]);
    let mut tried = Vec::new();
    let round = detach_interfaces(&left, |name| {
        tried.push(name.to_string());
        Ok::<(), String>(())
    });
    assert_eq!(tried, vec!["p-a".to_string()]);
    assert_eq!(round.attachment(), Attachment::Detached);
    assert_eq!(round.error(), None);
}

#[test]
fn a_start_finds_serving_draining_or_never_activated_programs_by_the_config_mode() {
    let now = Instant::now();
    assert_eq!(
        restored_attachment(false, Some(DATAPATH_MODE_ACTIVE), now),
        Attachment::Detached
    );
    assert_eq!(
        restored_attachment(true, Some(DATAPATH_MODE_ACTIVE), now),
        Attachment::Attached
    );
    assert_eq!(
        restored_attachment(true, Some(DATAPATH_MODE_DRAINING), now),
        Attachment::Draining { since: now }
    );
    assert_eq!(restored_attachment(true, None, now), Attachment::Detached);
    assert_eq!(
        restored_attachment(true, Some(0), now),
        Attachment::Detached
    );
}

#[test]
fn ebpf_mode_while_detaching_reactivates() {
    assert_eq!(
        follow_mode(
            Attachment::Detaching,
            Mode::Ebpf,
            TIMEOUT,
            None,
            Instant::now()
        ),
        (Attachment::Attached, Some(ModeAction::Activate))
    );
}

#[test]
fn ebpf_mode_while_draining_reactivates_without_detaching() {
    let start = Instant::now();
    let draining = Attachment::Draining { since: start };
    assert_eq!(
        follow_mode(draining, Mode::Ebpf, TIMEOUT, Some(9), start),
        (Attachment::Attached, Some(ModeAction::Activate))
    );
}
