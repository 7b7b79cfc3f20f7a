//! `priority::set_nice_of_every_thread` on this test process's own threads: the
//! catch-up after a restart lowers every thread of the agent, and restoring brings
//! back every one, including threads created while it was lowered (they inherit
//! their creator's nice value). Raising a priority back needs root, as the agent
//! has.

use std::sync::{mpsc, Arc, Barrier};

use switchyard_agent::priority::{self, CATCH_UP_NICE};

/// Starts a thread that reports its thread id and waits on `barrier`.
fn parked_thread(barrier: Arc<Barrier>) -> (u32, std::thread::JoinHandle<()>) {
    let (sender, receiver) = mpsc::channel();
    let handle = std::thread::spawn(move || {
        // SAFETY: gettid has no arguments and cannot fail.
        let thread_id = unsafe { libc::gettid() } as u32;
        sender.send(thread_id).expect("send the thread id");
        barrier.wait();
    });
    let thread_id = receiver.recv().expect("receive the thread id");
    (thread_id, handle)
}

#[test]
fn lowering_and_restoring_reach_every_thread_of_the_process() {
    let original = priority::current_nice().expect("read the nice value");
    assert_ne!(
        original, CATCH_UP_NICE,
        "the test starts at a normal priority"
    );
    let barrier = Arc::new(Barrier::new(4));
    let mut threads: Vec<_> = (0..2).map(|_| parked_thread(barrier.clone())).collect();

    let lowered = priority::set_nice_of_every_thread(CATCH_UP_NICE).expect("lower");
    assert!(
        lowered >= 3,
        "this thread and the two parked ones: {lowered}"
    );
    // SAFETY: as above.
    let this_thread = unsafe { libc::gettid() } as u32;
    for thread_id in threads.iter().map(|(id, _)| *id).chain([this_thread]) {
        assert_eq!(
            priority::thread_nice(thread_id).expect("read"),
            CATCH_UP_NICE,
            "thread {thread_id} after lowering"
        );
    }
    // A thread created during the catch-up inherits the lowered value.
    threads.push(parked_thread(barrier.clone()));
    let born_lowered = threads[2].0;
    assert_eq!(
        priority::thread_nice(born_lowered).expect("read"),
        CATCH_UP_NICE
    );

    let restored = priority::set_nice_of_every_thread(original).expect("restore (needs root)");
    assert!(
        restored >= 4,
        "this thread and the three parked ones: {restored}"
    );
    for thread_id in threads.iter().map(|(id, _)| *id).chain([this_thread]) {
        assert_eq!(
            priority::thread_nice(thread_id).expect("read"),
            original,
            "thread {thread_id} after restoring"
        );
    }
    barrier.wait();
    for (_, handle) in threads {
        handle.join().expect("join");
    }
}
