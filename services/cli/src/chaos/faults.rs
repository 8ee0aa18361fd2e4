//! The faults of a chaos run, in order. Each acts on the cluster while the steady load runs
//! (or, for the burst and the disconnects, instead of it) and says when it ended.

use std::future::Future;
use std::pin::Pin;
use std::time::{Duration, Instant};

use anyhow::Result;

use super::load::{Load, Shape};
use super::procs::{self, Node};
use super::{Cluster, Phase, READY_TIMEOUT};

type Run = for<'a> fn(
    &'a mut Cluster,
    &'a Load,
) -> Pin<Box<dyn Future<Output = Result<Phase>> + Send + 'a>>;

/// One fault: its name (the table's first column, and `--only`'s) and what it does.
pub(crate) struct Fault {
    pub name: &'static str,
    pub run: Run,
}

pub(crate) const ALL: [Fault; 10] = [
    Fault {
        name: "none",
        run: |c, l| Box::pin(none(c, l)),
    },
    Fault {
        name: "etcd_loss",
        run: |c, l| Box::pin(etcd_loss(c, l)),
    },
    Fault {
        name: "gateway_loss",
        run: |c, l| Box::pin(gateway_loss(c, l)),
    },
    Fault {
        name: "drain",
        run: |c, l| Box::pin(drain(c, l)),
    },
    Fault {
        name: "stopped_worker",
        run: |c, l| Box::pin(stopped_worker(c, l)),
    },
    Fault {
        name: "poisoned_worker",
        run: |c, l| Box::pin(poisoned_worker(c, l)),
    },
    Fault {
        name: "engine_panic",
        run: |c, l| Box::pin(engine_panic(c, l)),
    },
    Fault {
        name: "kv_burst",
        run: |c, l| Box::pin(kv_burst(c, l)),
    },
    Fault {
        name: "disconnects",
        run: |c, l| Box::pin(disconnects(c, l)),
    },
    Fault {
        name: "tp_rank_loss",
        run: |c, l| Box::pin(tp_rank_loss(c, l)),
    },
];

fn phase(name: &'static str, note: String) -> Phase {
    Phase {
        name,
        ended: Instant::now(),
        note,
    }
}

/// The exit of `node` within `limit`, as the table says it.
async fn exit_of(node: &mut Node, limit: Duration) -> String {
    match node.wait_exit(limit).await {
        Some(s) => s.to_string(),
        None => format!("still running after {limit:?}"),
    }
}

/// No fault: the baseline.
async fn none(_: &mut Cluster, _: &Load) -> Result<Phase> {
    tokio::time::sleep(Duration::from_secs(5)).await;
    Ok(phase("none", String::new()))
}

async fn etcd_loss(c: &mut Cluster, _: &Load) -> Result<Phase> {
    tokio::task::block_in_place(|| c.etcd.kill());
    tokio::time::sleep(Duration::from_secs(c.args.outage_s)).await;
    tokio::task::block_in_place(|| c.etcd.restart());
    Ok(phase(
        "etcd_loss",
        format!("etcd killed for {} s", c.args.outage_s),
    ))
}

async fn gateway_loss(c: &mut Cluster, _: &Load) -> Result<Phase> {
    c.gateway.signal("KILL")?;
    c.gateway.wait_exit(Duration::from_secs(5)).await;
    let started = Instant::now();
    c.gateway = Cluster::spawn_gateway(&c.etcd, c.grpc_port, c.http_port, &c.dir)?;
    c.gateway.ready(READY_TIMEOUT).await?;
    let note = format!("killed; back in {:.2} s", started.elapsed().as_secs_f64());
    Ok(phase("gateway_loss", note))
}

async fn drain(c: &mut Cluster, _: &Load) -> Result<Phase> {
    let started = Instant::now();
    let note = match c.pools.remove("b") {
        Some((mut node, _)) => {
            node.signal("TERM")?;
            let exit = exit_of(&mut node, Duration::from_secs(30)).await;
            format!(
                "pool b drained in {:.2} s ({exit})",
                started.elapsed().as_secs_f64()
            )
        }
        None => "no pool b".to_owned(),
    };
    let ended = phase("drain", note);
    c.add_pool("b2", &[]).await?;
    Ok(ended)
}

async fn stopped_worker(c: &mut Cluster, _: &Load) -> Result<Phase> {
    let Some((node, _)) = c.pools.get_mut("a") else {
        return Ok(phase("stopped_worker", "no pool a".into()));
    };
    node.signal("STOP")?;
    tokio::time::sleep(Duration::from_secs(c.args.outage_s)).await;
    node.signal("CONT")?;
    Ok(phase(
        "stopped_worker",
        format!("pool a stopped for {} s", c.args.outage_s),
    ))
}

async fn poisoned_worker(c: &mut Cluster, _: &Load) -> Result<Phase> {
    let file = procs::poisoned_copy(&c.model_file, &c.dir)?;
    let args = c.worker_args("poisoned", 0, 1, &file);
    let mut node = Node::spawn("pool-poisoned", &args, &[], &c.dir)?;
    let ready = node.ready(READY_TIMEOUT).await.is_ok();
    let exit = exit_of(&mut node, Duration::from_secs(30)).await;
    let note = if ready {
        format!("a NaN model SERVED ({exit})")
    } else {
        format!("a NaN model was refused at start ({exit})")
    };
    let _ = std::fs::remove_file(file);
    Ok(phase("poisoned_worker", note))
}

async fn engine_panic(c: &mut Cluster, _: &Load) -> Result<Phase> {
    // Past the warm-up, in the middle of serving.
    let failpoint = [("FERRITE_FAILPOINTS", "engine.step.panic=60")];
    c.add_pool("panicky", &failpoint).await?;
    let note = match c.pools.remove("panicky") {
        Some((mut node, _)) => format!(
            "the pool's engine panicked; the worker left ({})",
            exit_of(&mut node, Duration::from_secs(60)).await
        ),
        None => String::new(),
    };
    Ok(phase("engine_panic", note))
}

async fn kv_burst(c: &mut Cluster, load: &Load) -> Result<Phase> {
    load.pause().await;
    let shape = Shape {
        max_tokens: c.args.burst_tokens,
        disconnect: false,
    };
    let started = Instant::now();
    load.burst(c.args.burst, shape).await;
    let note = format!(
        "{} requests of {} tokens on {} MiB KV caches, {:.1} s",
        c.args.burst,
        c.args.burst_tokens,
        c.args.kv_cache_mib,
        started.elapsed().as_secs_f64()
    );
    load.resume();
    Ok(phase("kv_burst", note))
}

async fn disconnects(c: &mut Cluster, load: &Load) -> Result<Phase> {
    load.pause().await;
    let shape = Shape {
        max_tokens: 256,
        disconnect: true,
    };
    load.burst(c.args.disconnects, shape).await;
    // What a second after the crowd left still holds is what the table shows.
    let note = format!(
        "{} streams dropped after their first token",
        c.args.disconnects
    );
    load.resume();
    Ok(phase("disconnects", note))
}

async fn tp_rank_loss(c: &mut Cluster, _: &Load) -> Result<Phase> {
    let model = c.model_file.clone();
    let mut ranks = Vec::new();
    for rank in [2, 1] {
        let args = c.worker_args("tp", rank, 3, &model);
        ranks.push(Node::spawn(&format!("tp-rank-{rank}"), &args, &[], &c.dir)?);
    }
    let args = c.worker_args("tp", 0, 3, &model);
    let mut leader = Node::spawn("tp-rank-0", &args, &[], &c.dir)?;
    let lines = leader.ready(READY_TIMEOUT).await?;
    for r in &mut ranks {
        r.ready(READY_TIMEOUT).await?;
    }
    let addr = procs::addr_after(&lines, "serving on")?;
    c.pools.insert("tp".into(), (leader, addr));
    // Let the load reach the pool, then lose a rank.
    tokio::time::sleep(Duration::from_secs(5)).await;
    ranks[0].signal("KILL")?;
    let lost = Instant::now();
    let Some((mut leader, _)) = c.pools.remove("tp") else {
        return Ok(phase("tp_rank_loss", String::new()));
    };
    let leader_exit = exit_of(&mut leader, Duration::from_secs(60)).await;
    let left_after = lost.elapsed().as_secs_f64();
    let follower_exit = exit_of(&mut ranks[1], Duration::from_secs(60)).await;
    let note = format!(
        "rank 2 of 3 killed: rank 0 left after {left_after:.2} s ({leader_exit}), rank 1 {follower_exit}"
    );
    Ok(phase("tp_rank_loss", note))
}
