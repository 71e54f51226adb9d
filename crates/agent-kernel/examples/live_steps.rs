//! Live sagas of `noop` steps, driven from Rust: the Rust side of the Python package's
//! benchmark (`benches/python/run.sh` runs it beside `benches/python/live_steps.py`, which
//! does the same through `agent_kernel`).
//!
//! ```sh
//! cargo run --release -p agent-kernel --example live_steps -- SAGAS STEPS full|normal
//! ```
//!
//! Prints one JSON line: `{"driver": "rust", "sagas", "steps", "durability", "seconds",
//! "steps_per_s"}`. The log is in a temporary folder; building the kernel is not timed.

use std::time::Instant;

use agent_kernel::{BeginOptions, CallAnswer, Durability, KernelBuilder};
use serde_json::json;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [sagas, steps, durability] = args.as_slice() else {
        return Err("usage: live_steps SAGAS STEPS full|normal".into());
    };
    let (sagas, steps): (u32, u32) = (sagas.parse()?, steps.parse()?);
    let durability = match durability.as_str() {
        "full" => Durability::Full,
        "normal" => Durability::Normal,
        other => return Err(format!("durability is full or normal, not {other}").into()),
    };
    let dir = tempfile::tempdir()?;
    let kernel = KernelBuilder::new()
        .db(dir.path().join("bench.db"))
        .durability(durability)
        .cwd(dir.path())
        .build()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    let started = Instant::now();
    runtime.block_on(async {
        for _ in 0..sagas {
            let saga = kernel.begin(BeginOptions::default()).await?;
            for _ in 0..steps {
                let answer = saga.call("noop", json!({}), None).await?;
                assert!(matches!(answer, CallAnswer::Committed(_)), "{answer:?}");
            }
            saga.commit().await?;
        }
        Ok::<_, agent_kernel::KernelError>(())
    })?;
    let seconds = started.elapsed().as_secs_f64();
    let n_steps = f64::from(sagas * steps);
    println!(
        "{}",
        json!({
            "driver": "rust",
            "sagas": sagas,
            "steps": steps,
            "durability": args[2],
            "seconds": seconds,
            "steps_per_s": n_steps / seconds,
        })
    );
    Ok(())
}
