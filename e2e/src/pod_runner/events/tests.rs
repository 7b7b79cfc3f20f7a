use super::*;

fn event(at: u64, kind: EventKind, uid: &str, node: &str) -> RunnerEvent {
    RunnerEvent {
        at_unix_ms: at,
        kind,
        namespace: "kube-system".into(),
        pod: format!("kube-proxy-{uid}"),
        pod_uid: uid.into(),
        container: "kube-proxy".into(),
        node: node.into(),
        pid: Some(1),
        detail: None,
    }
}

#[test]
fn running_processes_are_those_started_and_not_exited() {
    let events = vec![
        event(1, EventKind::Started, "a", "node-1"),
        event(2, EventKind::Started, "b", "node-2"),
        event(3, EventKind::Terminating, "a", "node-1"),
        event(4, EventKind::Exited, "a", "node-1"),
        event(5, EventKind::Started, "c", "node-1"),
    ];
    let running = running_processes(&events, "kube-proxy");
    assert_eq!(running.keys().collect::<Vec<_>>(), vec!["b", "c"]);
    assert!(running_processes(&events, "agent").is_empty());
}

#[test]
fn a_replacement_pairs_the_old_exit_with_the_next_start_on_the_node() {
    let events = vec![
        event(1, EventKind::Started, "old-on-2", "node-2"),
        event(10, EventKind::Terminating, "a", "node-2"),
        event(11, EventKind::Started, "other", "node-3"),
        event(12, EventKind::Exited, "a", "node-2"),
        event(15, EventKind::Started, "b", "node-2"),
    ];
    let replacement = find_replacement(&events, "a", "kube-proxy", Some("node-2"), 5).unwrap();
    assert_eq!(replacement.started.pod_uid, "b");
    assert!(replacement.is_ordered());
    let anywhere = find_replacement(&events, "a", "kube-proxy", None, 5).unwrap();
    assert_eq!(anywhere.started.pod_uid, "other");
    assert!(
        !anywhere.is_ordered(),
        "started at 11, before the exit at 12"
    );
    assert!(find_replacement(&events, "b", "kube-proxy", Some("node-2"), 5).is_none());
}

#[test]
fn events_round_trip_through_the_log_and_a_torn_line_is_skipped() {
    let path = std::env::temp_dir().join(format!("sy-e2e-events-{}.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&path);
    assert!(read_events(&path).unwrap().is_empty());
    let event = RunnerEvent {
        at_unix_ms: 5,
        kind: EventKind::Started,
        namespace: "kube-system".into(),
        pod: "kube-proxy-x".into(),
        pod_uid: "u".into(),
        container: "kube-proxy".into(),
        node: "node-1".into(),
        pid: Some(42),
        detail: None,
    };
    append_event(&path, &event).unwrap();
    std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .and_then(|mut file| file.write_all(b"{\"at_unix_ms\": 6, \"ki"))
        .unwrap();
    let events = read_events(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(events, vec![event]);
}
