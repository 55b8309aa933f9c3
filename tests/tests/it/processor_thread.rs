//! The fan-out processor runs on a thread of its own, beside the cell's
//! runtime (so it does not queue behind the cell's stream tasks): pushes
//! still reach devices through it, and stopping the cell ends that thread,
//! so a process that starts and stops cells keeps no thread per cell, and
//! so does the shutdown of the runtime the cell was started on.
//! (Threads are counted per process: the test runner gives each test one.)

use std::time::Duration;

use cellmesh_tests::sync::{connect_sync, messages, subscribe};
use cellmesh_tests::{TestCell, create_group, eventually, send_direct, text};

/// Threads of this process named like the processor's (the kernel keeps
/// 15 bytes of a name: `cellmesh-processor` reads `cellmesh-proces`).
fn processor_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("the process's threads")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.trim() == "cellmesh-proces")
        .count()
}

/// The bodies a member's device is pushed when user 1 sends `body` into a
/// new group of theirs on `cell` (the fan-out processor's work).
async fn pushed_through(cell: &TestCell, body: &str) -> Vec<String> {
    let mut client = cell.client().await;
    let conv = create_group(&mut client, 1, 1, &[2, 3]).await;
    let mut sync = connect_sync(&cell.endpoint).await;
    let mut stream = subscribe(&mut sync, 1, 3, "phone", 0).await;
    send_direct(&mut client, text(1, 1, conv, "r1", body)).await;
    let events = messages(&mut stream, 1, Duration::from_secs(10)).await;
    (events.iter())
        .filter_map(|e| e.message.as_ref())
        .map(|m| String::from_utf8_lossy(&m.body).into_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_processor_runs_on_a_thread_of_its_own_that_ends_with_the_cell() {
    assert_eq!(processor_threads(), 0);
    let cell = TestCell::start().await;
    assert_eq!(processor_threads(), 1, "one processor thread per cell");

    let bodies = pushed_through(&cell, "through the processor").await;
    assert_eq!(bodies, ["through the processor"]);

    let _dir = cell.stop().await;
    let ended = eventually(Duration::from_secs(5), || async {
        processor_threads() == 0
    })
    .await;
    assert!(ended, "stopping the cell ends its processor's thread");
}

/// A cell never stopped, whose runtime shuts down (a test that ends, a
/// `main` that returns): its processor's thread has ended by the time the
/// shutdown returns, so nothing uses the store while the process exits.
#[test]
fn the_processor_thread_ends_when_its_cells_runtime_shuts_down() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let cell = runtime.block_on(async {
        let cell = TestCell::start().await;
        let mut client = cell.client().await;
        let conv = create_group(&mut client, 1, 1, &[2]).await;
        send_direct(&mut client, text(1, 1, conv, "r1", "before the shutdown")).await;
        cell
    });
    assert_eq!(processor_threads(), 1);
    drop(runtime);
    assert_eq!(processor_threads(), 0, "the shutdown waited for the thread");
    drop(cell);
}

/// The fan-out's two threads (the processor and the fan-out's commit lane)
/// run at `storage.fanout_nice`, ahead of the cell's runtime; the message
/// lane keeps the process's nice. Where the process may not lower a nice
/// (no `CAP_SYS_NICE`), the cell still starts and pushes, at its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fan_out_threads_run_at_the_configured_nice() {
    use cellmesh_cell::priority::{Applied, nice_of_thread, set_this_thread};
    let (own, lowering) = std::thread::Builder::new()
        .name("cellmesh-probe".into())
        .spawn(|| {
            let own = nice_of_thread("cellmesh-probe").expect("this thread");
            (own, set_this_thread(own - 5, "probe") == Applied::Set)
        })
        .unwrap()
        .join()
        .unwrap();
    let asked = own - 5;
    let cell = TestCell::start_with(
        |config| config.storage.fanout_nice = asked,
        std::sync::Arc::new(cellmesh_cell::clock::SystemClock),
    )
    .await;
    let expected = if lowering { asked } else { own };
    assert_eq!(nice_of_thread("cellmesh-proces"), Some(expected));
    assert_eq!(nice_of_thread("cellmesh-fanout"), Some(expected));
    assert_eq!(nice_of_thread("cellmesh-commit"), Some(own));
    assert_eq!(pushed_through(&cell, "pushed").await, ["pushed"]);
}
