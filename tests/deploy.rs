//! The deployment files and the image: the Kubernetes manifests are valid against a
//! current Kubernetes schema (kubernetes-validate, offline), every snag command in
//! them and in compose.yaml is one the CLI takes, their fault files load, every image
//! is this version's, and the image scripts/image.sh assembles runs snag.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use clap::Parser;
use snag::cli::Cli;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn manifests() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo().join("deploy/kubernetes"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

/// A directory of the test's own, removed when dropped.
struct Scratch(PathBuf);

impl Scratch {
    fn new(test: &str) -> Scratch {
        let dir = std::env::temp_dir().join(format!("snag-test-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Scratch(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Every container in `files` (Kubernetes pod templates, compose services) whose
/// image is snag's: its image, its arguments, and the fault files (ConfigMap keys and
/// compose configs ending in .toml or named `interposer`) beside it, read with PyYAML.
fn read_yaml(files: &[PathBuf]) -> serde_json::Value {
    const WALK: &str = r#"
import json, sys, yaml
found = {"containers": [], "faults": []}
def walk(node, where):
    if isinstance(node, dict):
        image = node.get("image")
        args = node.get("args", node.get("command"))
        if isinstance(image, str) and image.startswith("snag:") and isinstance(args, list):
            found["containers"].append({"where": where, "image": image, "args": [str(a) for a in args]})
        if node.get("kind") == "ConfigMap":
            for key, text in node.get("data", {}).items():
                found["faults"].append({"where": where + ":" + key, "text": text})
        for key, value in node.items():
            if key == "configs" and isinstance(value, dict):
                for name, config in value.items():
                    if isinstance(config, dict) and "content" in config:
                        found["faults"].append({"where": where + ":" + name, "text": config["content"]})
            walk(value, where)
    elif isinstance(node, list):
        for item in node:
            walk(item, where)
for path in sys.argv[1:]:
    with open(path) as f:
        for doc in yaml.safe_load_all(f):
            walk(doc, path)
print(json.dumps(found))
"#;
    let out = Command::new("python3")
        .arg("-c")
        .arg(WALK)
        .args(files)
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "reading the YAML needs PyYAML (kubernetes-validate brings it; scripts/install-deps.sh installs it): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn kubernetes_manifests_validate_against_a_current_schema() {
    let out = Command::new("kubernetes-validate")
        .arg("--strict")
        .args(manifests())
        .output()
        .expect("kubernetes-validate runs (scripts/install-deps.sh installs it from PyPI)");
    let said =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{said}");
    // Each of the issue's parts is there: a Deployment with the sidecar, an Indexed
    // Job of generators, a Job that merges, a ConfigMap of fault files.
    for kind in [
        "deployment/snag-backend",
        "job/snag-generator",
        "job/snag-runner",
        "configmap/snag-faults",
        "persistentvolumeclaim/snag-results",
    ] {
        assert!(
            said.contains(&format!("passed for resource {kind}")),
            "{kind}: {said}"
        );
    }
}

#[test]
fn every_snag_command_deployed_is_one_the_cli_takes_and_every_fault_file_loads() {
    let mut files = manifests();
    files.push(repo().join("deploy/compose.yaml"));
    let found = read_yaml(&files);
    let containers = found["containers"].as_array().unwrap();
    assert!(containers.len() >= 8, "{found:#}");
    let version = format!("snag:{}", env!("CARGO_PKG_VERSION"));
    for c in containers {
        assert_eq!(c["image"], version.as_str(), "{c}");
        // The values Kubernetes and compose put in at run time.
        let args: Vec<String> = c["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| {
                let a = a.as_str().unwrap();
                if a.starts_with("${START_AT") {
                    return "1900000000".to_string();
                }
                a.replace("$(START_AT)", "2030-01-01T00:00:00Z")
                    .replace("$(JOB_INDEX)", "0")
                    .replace("$(POD_NAME)", "pod-0")
                    .replace("$(NODE_NAME)", "node-0")
            })
            .collect();
        // `--shard N` reads its index from the pod's JOB_COMPLETION_INDEX, which this
        // process has not (tests/load_shards.rs runs that form with it).
        let args: Vec<String> = args
            .iter()
            .zip(std::iter::once("").chain(args.iter().map(String::as_str)))
            .map(|(a, before)| {
                if before == "--shard" && !a.contains('/') {
                    format!("0/{a}")
                } else {
                    a.clone()
                }
            })
            .collect();
        let line = std::iter::once("snag".to_string()).chain(args.clone());
        if let Err(e) = Cli::try_parse_from(line) {
            panic!("{} runs `snag {}`: {e}", c["where"], args.join(" "));
        }
    }
    let faults = found["faults"].as_array().unwrap();
    assert!(faults.len() >= 3, "{found:#}");
    let dir = Scratch::new("deploy-faults");
    for (i, f) in faults.iter().enumerate() {
        let path = dir.0.join(format!("{i}.toml"));
        std::fs::write(&path, f["text"].as_str().unwrap()).unwrap();
        let scenario =
            snag::fault::file::load(&path).unwrap_or_else(|e| panic!("{}: {e}", f["where"]));
        assert!(!scenario.proxies.is_empty(), "{}", f["where"]);
    }
}

fn sha256(path: &Path) -> String {
    let out = Command::new("sha256sum").arg(path).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

/// The image from the test's own build (stripped: the image's size is not the
/// point here), checked as an OCI layout and then run: the layer unpacked and snag
/// started in it by chroot, as the image's user, with nothing of this machine's.
#[test]
fn the_image_is_an_oci_layout_whose_snag_runs_alone() {
    let dir = Scratch::new("image");
    let bin = dir.0.join("snag");
    std::fs::copy(env!("CARGO_BIN_EXE_snag"), &bin).unwrap();
    let stripped = Command::new("strip")
        .arg(&bin)
        .status()
        .expect("strip runs (binutils)");
    assert!(stripped.success());
    let image = |out: &Path| {
        Command::new("bash")
            .arg(repo().join("scripts/image.sh"))
            .arg(out)
            .env("SNAG_BIN", &bin)
            .output()
            .unwrap()
    };
    let out = dir.0.join("image");
    let built = image(&out);
    assert!(
        built.status.success(),
        "{}{}",
        String::from_utf8_lossy(&built.stdout),
        String::from_utf8_lossy(&built.stderr)
    );
    assert!(out.with_extension("tar").exists());
    // Reproducible: the same inputs make the same manifest digest.
    let again = dir.0.join("again");
    assert!(image(&again).status.success());
    assert_eq!(
        std::fs::read(out.join("index.json")).unwrap(),
        std::fs::read(again.join("index.json")).unwrap()
    );

    // index → manifest → config and layer, each blob named by its digest.
    let read = |p: &Path| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap()
    };
    let blob = |digest: &serde_json::Value| {
        let hex = digest
            .as_str()
            .unwrap()
            .strip_prefix("sha256:")
            .unwrap()
            .to_string();
        let path = out.join("blobs/sha256").join(&hex);
        assert_eq!(sha256(&path), hex, "{}", path.display());
        path
    };
    assert_eq!(read(&out.join("oci-layout"))["imageLayoutVersion"], "1.0.0");
    let index = read(&out.join("index.json"));
    let entry = &index["manifests"][0];
    let version = format!("snag:{}", env!("CARGO_PKG_VERSION"));
    assert_eq!(
        entry["annotations"]["org.opencontainers.image.ref.name"],
        version.as_str()
    );
    let manifest = read(&blob(&entry["digest"]));
    let config = read(&blob(&manifest["config"]["digest"]));
    assert_eq!(config["config"]["Entrypoint"][0], "/usr/local/bin/snag");
    assert_eq!(config["config"]["User"], "65534:65534");
    let layer = blob(&manifest["layers"][0]["digest"]);

    // The layer's uncompressed digest is the config's diff_id.
    let rootfs = dir.0.join("rootfs");
    std::fs::create_dir_all(&rootfs).unwrap();
    let tar = dir.0.join("layer.tar");
    let unzipped = Command::new("bash")
        .arg("-c")
        .arg(format!("gzip -dc {} > {}", layer.display(), tar.display()))
        .status()
        .unwrap();
    assert!(unzipped.success());
    assert_eq!(
        config["rootfs"]["diff_ids"][0].as_str().unwrap(),
        format!("sha256:{}", sha256(&tar))
    );
    let unpacked = Command::new("tar")
        .arg("-xf")
        .arg(&tar)
        .arg("-C")
        .arg(&rootfs)
        .status()
        .unwrap();
    assert!(unpacked.success());
    let ran = Command::new("chroot")
        .args(["--userspec=65534:65534"])
        .arg(&rootfs)
        .args(["/usr/local/bin/snag", "--version"])
        .output()
        .expect("chroot runs (needs root, as the network-namespace tests do)");
    assert!(
        ran.status.success(),
        "{}",
        String::from_utf8_lossy(&ran.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&ran.stdout).trim(),
        format!("snag {}", env!("CARGO_PKG_VERSION"))
    );
}
