//! Starting one pod: its volumes, init containers, containers (the image's entrypoint and
//! environment under the manifest's), and the tasks that run its probes.

use super::*;

/// What a pod's probe tasks report into.
struct Watch {
    started: Instant,
    ready_after: Arc<Mutex<Option<Duration>>>,
    problems: Arc<Mutex<Vec<String>>>,
    last_failure: Arc<Mutex<BTreeMap<String, String>>>,
}

pub(super) struct StartContext {
    pub(super) rewrites: Rewrites,
    pub(super) images: Images,
    pub(super) config_maps: BTreeMap<String, BTreeMap<String, String>>,
    pub(super) workdir: PathBuf,
    pub(super) states: States,
    pub(super) seeds: BTreeMap<String, Seed>,
}

impl StartContext {
    pub(super) async fn start_pod(self, plan: PodPlan) -> Result<Pod> {
        let started = Instant::now();
        let volumes = self.volumes(&plan)?;
        for init in plan.init_containers() {
            let mut c = self.start_container(&plan, &init, &volumes)?;
            let status = c.proc.wait_exit(INIT_TIMEOUT).await;
            match status {
                Ok(s) if s.success() => {}
                other => {
                    let report = c.proc.stderr_report().await;
                    bail!(
                        "pod {} init container {} did not succeed ({other:?}); argv {:?}\n{report}",
                        plan.name,
                        c.name,
                        c.argv
                    );
                }
            }
        }
        let mut containers = Vec::new();
        let mut forwards = Vec::new();
        for spec in plan.containers() {
            let repo = repository(str_at(&spec, "/image")).to_owned();
            if let Some(ports) = self.images.stand_ins.get(&repo) {
                for port in array(&spec, "ports") {
                    if let Some(to) = ports.get(str_at(&port, "/name")) {
                        let number = PodPlan::resolve_port(&spec, &port["containerPort"])?;
                        let at = SocketAddr::new(IpAddr::V4(plan.ip), number);
                        forwards.push(proxy::forward(at, *to).await?);
                    }
                }
                continue;
            }
            containers.push(self.start_container(&plan, &spec, &volumes)?);
        }
        let ready_after = Arc::new(Mutex::new(None));
        let problems = Arc::new(Mutex::new(Vec::new()));
        let last_failure = Arc::new(Mutex::new(BTreeMap::new()));
        let watch = Watch {
            started,
            ready_after: ready_after.clone(),
            problems: problems.clone(),
            last_failure: last_failure.clone(),
        };
        let probes = self.start_probes(&plan, &containers, &watch)?;
        Ok(Pod {
            plan,
            containers,
            ready_after,
            problems,
            last_failure,
            probes,
            _forwards: forwards,
        })
    }

    /// Local directories for the pod's volumes, by volume name.
    fn volumes(&self, plan: &PodPlan) -> Result<BTreeMap<String, PathBuf>> {
        let mut dirs = BTreeMap::new();
        for v in array(&plan.spec, "volumes") {
            let name = str_at(&v, "/name").to_owned();
            let dir = if let Some(claim) = v.pointer("/persistentVolumeClaim/claimName") {
                self.workdir
                    .join("claims")
                    .join(claim.as_str().unwrap_or(""))
            } else {
                self.workdir.join("pods").join(&plan.name).join(&name)
            };
            std::fs::create_dir_all(&dir)?;
            if let Some(cm) = v.pointer("/configMap/name").and_then(Value::as_str) {
                let data = self
                    .config_maps
                    .get(cm)
                    .with_context(|| format!("pod {}: no ConfigMap {cm}", plan.name))?;
                for (key, value) in data {
                    std::fs::write(dir.join(key), value)?;
                }
            } else if v.get("emptyDir").is_none() && v.get("persistentVolumeClaim").is_none() {
                bail!(
                    "pod {}: volume {name} is of a kind the rehearsal does not know",
                    plan.name
                );
            }
            if let Some(seed) = self.seeds.get(&name) {
                place_seed(&dir, seed)?;
            }
            dirs.insert(name, dir);
        }
        Ok(dirs)
    }

    fn start_container(
        &self,
        plan: &PodPlan,
        spec: &Value,
        volumes: &BTreeMap<String, PathBuf>,
    ) -> Result<Container> {
        let name = str_at(spec, "/name").to_owned();
        let image = str_at(spec, "/image");
        let config = self
            .images
            .configs
            .get(repository(image))
            .cloned()
            .unwrap_or_default();
        // The variables Kubernetes knows (envFrom, then env in order), for $(VAR) expansion.
        let mut vars = BTreeMap::new();
        for from in array(spec, "envFrom") {
            let cm = str_at(&from, "/configMapRef/name");
            let data = self
                .config_maps
                .get(cm)
                .with_context(|| format!("{name}: envFrom a missing ConfigMap {cm}"))?;
            vars.extend(data.clone());
        }
        for e in array(spec, "env") {
            let key = str_at(&e, "/name").to_owned();
            let value = if let Some(v) = e.get("value").and_then(Value::as_str) {
                expand(v, &vars)
            } else if let Some(path) = e.pointer("/valueFrom/fieldRef/fieldPath") {
                plan.field(path.as_str().unwrap_or(""))?
            } else if let Some(r) = e.pointer("/valueFrom/configMapKeyRef") {
                let (cm, key) = (str_at(r, "/name"), str_at(r, "/key"));
                self.config_maps
                    .get(cm)
                    .and_then(|d| d.get(key))
                    .cloned()
                    .with_context(|| format!("{name}: no key {key} in ConfigMap {cm}"))?
            } else {
                bail!("{name}: env {key}: a source the rehearsal does not know: {e}");
            };
            vars.insert(key, value);
        }
        if let Some(overrides) = self.images.env_overrides.get(repository(image)) {
            vars.extend(overrides.iter().cloned());
        }
        let strings = |key: &str| -> Option<Vec<String>> {
            spec.get(key).and_then(Value::as_array).map(|a| {
                a.iter()
                    .map(|s| expand(s.as_str().unwrap_or(""), &vars))
                    .collect()
            })
        };
        let argv: Vec<String> = match (strings("command"), strings("args")) {
            (Some(cmd), args) => cmd.into_iter().chain(args.unwrap_or_default()).collect(),
            (None, Some(args)) => config.entrypoint.iter().cloned().chain(args).collect(),
            (None, None) => config
                .entrypoint
                .iter()
                .chain(config.cmd.iter())
                .cloned()
                .collect(),
        };
        anyhow::ensure!(!argv.is_empty(), "{name}: nothing to run (image {image})");
        // Mounts, longest path first, so /var/cache/ferrite/x maps inside its own volume.
        let mut mounts: Vec<(String, PathBuf)> = array(spec, "volumeMounts")
            .iter()
            .map(|m| {
                let vol = str_at(m, "/name");
                let dir = volumes
                    .get(vol)
                    .cloned()
                    .with_context(|| format!("{name}: mounts a missing volume {vol}"))?;
                Ok((str_at(m, "/mountPath").to_owned(), dir))
            })
            .collect::<Result<_>>()?;
        mounts.sort_by_key(|(p, _)| std::cmp::Reverse(p.len()));
        let ip = plan.ip.to_string();
        let map = |s: &str| self.rewrites.apply(s, &ip, &mounts);
        let mut env: BTreeMap<String, String> = config.env.iter().cloned().collect();
        env.extend(vars);
        // A container's HOME is its image user's home: here an empty directory of the pod.
        let home = self.workdir.join("pods").join(&plan.name).join("home");
        std::fs::create_dir_all(&home)?;
        env.entry("HOME".into())
            .or_insert_with(|| home.to_string_lossy().into_owned());
        env.insert("HOSTNAME".into(), plan.name.clone());
        env.insert("PATH".into(), std::env::var("PATH").unwrap_or_default());
        let argv: Vec<String> = argv.iter().map(|s| map(s)).collect();
        let program = self
            .images
            .executables
            .get(&argv[0])
            .cloned()
            .with_context(|| format!("{name}: no local program for {}", argv[0]))?;
        let mut full = vec!["-i".to_owned()];
        full.extend(env.iter().map(|(k, v)| format!("{k}={}", map(v))));
        full.push(program.to_string_lossy().into_owned());
        full.extend(argv[1..].iter().cloned());
        let proc = Proc::spawn(
            format!("{}/{name}", plan.name),
            Path::new("/usr/bin/env"),
            &full,
        )?;
        Ok(Container {
            name,
            spec: spec.clone(),
            proc,
            argv,
        })
    }

    /// One task per container: the start-up probe until it passes (or gives up), then the
    /// readiness and liveness probes on their periods. The pod's Ready time is recorded when
    /// every container's readiness probe (or, lacking one, its start) has passed.
    fn start_probes(
        &self,
        plan: &PodPlan,
        containers: &[Container],
        watch: &Watch,
    ) -> Result<Vec<tokio::task::JoinHandle<()>>> {
        let ip = IpAddr::V4(plan.ip);
        let started = watch.started;
        if containers.is_empty() {
            // A stand-in pod: ready as soon as its ports forward.
            *lock(&watch.ready_after) = Some(started.elapsed());
            if let Some(s) = lock(&self.states).get_mut(&plan.name) {
                s.ready = true;
            }
        }
        let ready_flags = Arc::new(Mutex::new(vec![false; containers.len()]));
        let mut tasks = Vec::new();
        for (i, c) in containers.iter().enumerate() {
            let startup = Probe::of(&c.spec, "startupProbe", ip)?;
            let readiness = Probe::of(&c.spec, "readinessProbe", ip)?;
            let liveness = Probe::of(&c.spec, "livenessProbe", ip)?;
            let who = format!("{}/{}", plan.name, c.name);
            let (flags, ready_after, problems) = (
                ready_flags.clone(),
                watch.ready_after.clone(),
                watch.problems.clone(),
            );
            let last_failure = watch.last_failure.clone();
            let (states, pod) = (self.states.clone(), plan.name.clone());
            tasks.push(tokio::spawn(async move {
                if let Some(p) = &startup
                    && let Err(e) = run_until_success(p, &who, &last_failure).await
                {
                    lock(&problems).push(format!("{who}: {e}"));
                    return;
                }
                let set_ready = |ready: bool| {
                    let mut f = lock(&flags);
                    f[i] = ready;
                    let all = f.iter().all(|r| *r);
                    if let Some(s) = lock(&states).get_mut(&pod) {
                        s.ready = all;
                    }
                    let mut at = lock(&ready_after);
                    if all && at.is_none() {
                        *at = Some(started.elapsed());
                    }
                };
                let live = liveness.map(|p| {
                    let (problems, who) = (problems.clone(), who.clone());
                    tokio::spawn(async move { watch_liveness(&p, &who, &problems).await })
                });
                match readiness {
                    None => set_ready(true),
                    Some(p) => {
                        tokio::time::sleep(p.initial_delay).await;
                        let mut failures = 0;
                        loop {
                            match p.run().await {
                                Ok(()) => {
                                    failures = 0;
                                    set_ready(true);
                                }
                                Err(e) => {
                                    lock(&last_failure)
                                        .insert(who.clone(), format!("{}: {e:#}", p.what));
                                    failures += 1;
                                    if failures >= p.failure_threshold {
                                        set_ready(false);
                                    }
                                }
                            }
                            tokio::time::sleep(p.period).await;
                        }
                    }
                }
                if let Some(l) = live {
                    let _ = l.await;
                }
            }));
        }
        Ok(tasks)
    }
}

/// A start-up probe: tried every period until it passes, giving up after failureThreshold.
async fn run_until_success(
    p: &Probe,
    who: &str,
    last_failure: &Mutex<BTreeMap<String, String>>,
) -> Result<()> {
    tokio::time::sleep(p.initial_delay).await;
    let mut last = String::new();
    for _ in 0..p.failure_threshold {
        match p.run().await {
            Ok(()) => return Ok(()),
            Err(e) => {
                last = format!("{e:#}");
                lock(last_failure).insert(who.to_owned(), format!("{}: {last}", p.what));
            }
        }
        tokio::time::sleep(p.period).await;
    }
    bail!(
        "{} failed {} times (the kubelet would restart the container): {last}",
        p.what,
        p.failure_threshold
    )
}

async fn watch_liveness(p: &Probe, who: &str, problems: &Mutex<Vec<String>>) {
    tokio::time::sleep(p.initial_delay).await;
    let mut failures = 0;
    loop {
        match p.run().await {
            Ok(()) => failures = 0,
            Err(e) => {
                failures += 1;
                if failures >= p.failure_threshold {
                    lock(problems).push(format!(
                        "{who}: {} failed {failures} times (the kubelet would restart it): {e:#}",
                        p.what
                    ));
                    return;
                }
            }
        }
        tokio::time::sleep(p.period).await;
    }
}
