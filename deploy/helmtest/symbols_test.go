package helmtest

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// Symbols are on by default, in a StatefulSet of one pod that owns a
// ReadWriteOnce volume and serves the store: the agents upload to its
// Service, every gateway replica reads it over HTTP (the symbolstore
// extension in remote mode, through the symbol_store source), and the token
// is mounted in all three.
func TestSymbols(t *testing.T) {
	d := mustTemplate(t, "--set", "symbols.token.value=t0ken")
	sec := d.must(t, "Secret", release+"-symbols-token")
	wantEqual(t, "token secret data", str(sec, "data", "token"), "dDBrZW4=")
	const url = "http://ps-symbols.profiling.svc.cluster.local:8002"

	sts := d.must(t, "StatefulSet", symbolsName)
	wantEqual(t, "replicas", fmt.Sprint(get(sts, "spec", "replicas")), "1")
	claim := get(sts, "spec", "volumeClaimTemplates", "0")
	wantEqual(t, "claim", str(claim, "metadata", "name"), "data")
	wantEqual(t, "claim access", fmt.Sprint(strs(claim, "spec", "accessModes")), "[ReadWriteOnce]")
	wantEqual(t, "claim size", str(claim, "spec", "resources", "requests", "storage"), "20Gi")
	sc := container(sts)
	wantEqual(t, "store listens", str(env(sc)["PROFSYM_SYMBOLS_LISTEN"], "value"), "0.0.0.0:8002")
	mounts := map[string]string{}
	for _, m := range list(sc, "volumeMounts") {
		mounts[str(m, "name")] = str(m, "mountPath")
	}
	if mounts["data"] != "/var/lib/profsym/symbols" || mounts["symbols-token"] != "/etc/profsym-symbols" {
		t.Errorf("store mounts: %v", mounts)
	}
	scfg := collectorConfig(t, d.must(t, "ConfigMap", symbolsName))
	wantEqual(t, "store directory", str(scfg, "extensions", "symbolstore", "storage", "directory"), "/var/lib/profsym/symbols")
	wantEqual(t, "store auth", str(scfg, "extensions", "symbolstore", "auth", "authenticator"), "bearertokenauth/symbols")
	// The store cannot fill its volume: 90% of persistence.size.
	wantEqual(t, "store max_stored_bytes", fmt.Sprint(get(scfg, "extensions", "symbolstore", "max_stored_bytes")), fmt.Sprint(int64(20<<30)*9/10))
	wantEqual(t, "store max_objects", fmt.Sprint(get(scfg, "extensions", "symbolstore", "max_objects")), "500000")
	if !slices.Contains(strs(scfg, "service", "extensions"), "symbolstore") {
		t.Errorf("the store pod does not run the store: %v", scfg["service"])
	}
	svc := d.must(t, "Service", symbolsName)
	wantEqual(t, "store service port", fmt.Sprint(get(svc, "spec", "ports", "0", "port")), "8002")
	wantEqual(t, "store service selects", str(svc, "spec", "selector", "app.kubernetes.io/component"), "symbols")

	gcfg := collectorConfig(t, d.must(t, "ConfigMap", gatewayName))
	wantEqual(t, "gateway reads the store", str(gcfg, "extensions", "symbolstore", "storage", "remote", "endpoint"), url)
	wantEqual(t, "gateway's token", str(gcfg, "extensions", "symbolstore", "storage", "remote", "auth", "authenticator"), "bearertokenauth/symbols")
	wantEqual(t, "processor reads the store", str(gcfg, "processors", "symbolization", "symbol_store"), "symbolstore")
	if !slices.Contains(strs(gcfg, "service", "extensions"), "symbolstore") || !slices.Contains(strs(gcfg, "processors", "symbolization", "sources"), "symbol_store") {
		t.Errorf("gateway does not read the store: %v", gcfg["service"])
	}
	// Replicas share symbol indexes through the store with no setting
	// (docs/symbol-index.md): the processor's default must stand.
	if v := get(gcfg, "processors", "symbolization", "symbol_index"); v != nil {
		t.Errorf("the chart sets symbol_index (%v): replicas share indexes by default", v)
	}
	gw := container(d.must(t, "Deployment", gatewayName))
	if _, ok := env(gw)["PROFSYM_SYMBOLS_LISTEN"]; ok {
		t.Error("gateways listen for uploads with the StatefulSet store")
	}
	for _, p := range list(d.must(t, "Service", gatewayName), "spec", "ports") {
		if str(p, "name") == "symbols" {
			t.Error("the gateway Service has a symbols port with the StatefulSet store")
		}
	}

	ag := d.must(t, "DaemonSet", agentName)
	acfg := collectorConfig(t, d.must(t, "ConfigMap", agentName))
	wantEqual(t, "upload endpoint", str(acfg, "processors", "symbolupload", "endpoint"), url)
	wantEqual(t, "agent token file", str(acfg, "extensions", "bearertokenauth/symbols", "filename"), "/etc/profsym-symbols/token")
	if !slices.Contains(strs(acfg, "service", "pipelines", "profiles", "processors"), "symbolupload") {
		t.Error("symbolupload not in the agent's pipeline")
	}
	vols := map[string]bool{}
	for _, v := range list(ag, "spec", "template", "spec", "volumes") {
		vols[str(v, "name")] = str(v, "secret", "secretName") == release+"-symbols-token" || str(v, "name") == "symbols-scratch"
	}
	if !vols["symbols-token"] || !vols["symbols-scratch"] {
		t.Errorf("agent volumes: %v", vols)
	}

	// Persistence off: an emptyDir; an existing claim: that claim.
	d = mustTemplate(t, "--set", "symbols.store.persistence.enabled=false")
	sts = d.must(t, "StatefulSet", symbolsName)
	if get(sts, "spec", "volumeClaimTemplates") != nil || str(volume(sts, "data"), "emptyDir", "sizeLimit") != "20Gi" {
		t.Errorf("without persistence: %v", volume(sts, "data"))
	}
	d = mustTemplate(t, "--set", "symbols.store.persistence.enabled=false", "--set", "symbols.store.sizeLimit=1Gi")
	wantEqual(t, "store max_stored_bytes on an emptyDir", fmt.Sprint(get(collectorConfig(t, d.must(t, "ConfigMap", symbolsName)), "extensions", "symbolstore", "max_stored_bytes")), fmt.Sprint(int64(1<<30)*9/10))
	d = mustTemplate(t, "--set", "symbols.store.persistence.existingClaim=symbols-pvc")
	if str(volume(d.must(t, "StatefulSet", symbolsName), "data"), "persistentVolumeClaim", "claimName") != "symbols-pvc" {
		t.Error("existing claim not used")
	}

	// Off: nothing of it.
	d = mustTemplate(t, "--set", "symbols.enabled=false", "--set", "symbols.token.value=t0ken")
	if d.find("Secret", release+"-symbols-token") != nil || d.find("StatefulSet", symbolsName) != nil || d.find("Service", symbolsName) != nil ||
		mapping(collectorConfig(t, d.must(t, "ConfigMap", gatewayName)), "extensions", "symbolstore") != nil ||
		mapping(collectorConfig(t, d.must(t, "ConfigMap", agentName)), "processors", "symbolupload") != nil {
		t.Error("symbols rendered while disabled")
	}
}

// With a bucket, every gateway replica runs the store over it and serves
// uploads on the gateway Service; no StatefulSet.
func TestSymbolsS3(t *testing.T) {
	d := mustTemplate(t, "--set", "symbols.token.value=t0ken",
		"--set", "symbols.store.s3.bucket=symbols", "--set", "symbols.store.s3.endpoint=minio.storage:9000",
		"--set", "symbols.store.s3.existingSecret=s3-creds")
	if d.find("StatefulSet", symbolsName) != nil || d.find("Service", symbolsName) != nil {
		t.Error("a StatefulSet store with S3")
	}
	gw := container(d.must(t, "Deployment", gatewayName))
	e := env(gw)
	wantEqual(t, "PROFSYM_SYMBOLS_LISTEN", str(e["PROFSYM_SYMBOLS_LISTEN"], "value"), "0.0.0.0:8002")
	wantEqual(t, "S3 secret key from", str(e["PROFSYM_SYMBOLS_S3_SECRET_KEY"], "valueFrom", "secretKeyRef", "name"), "s3-creds")
	gcfg := collectorConfig(t, d.must(t, "ConfigMap", gatewayName))
	wantEqual(t, "store bucket", str(gcfg, "extensions", "symbolstore", "storage", "s3", "bucket"), "symbols")
	wantEqual(t, "store auth", str(gcfg, "extensions", "symbolstore", "auth", "authenticator"), "bearertokenauth/symbols")
	wantEqual(t, "scratch", str(gcfg, "extensions", "symbolstore", "storage", "scratch_directory"), "/var/lib/profsym/symbols")
	found := false
	for _, p := range list(d.must(t, "Service", gatewayName), "spec", "ports") {
		found = found || (str(p, "name") == "symbols" && fmt.Sprint(get(p, "port")) == "8002")
	}
	if !found {
		t.Error("the gateway Service has no symbols port")
	}
	wantEqual(t, "upload endpoint", str(collectorConfig(t, d.must(t, "ConfigMap", agentName)), "processors", "symbolupload", "endpoint"),
		"http://ps-gateway.profiling.svc.cluster.local:8002")
	if _, err := template(t, "--set", "symbols.store.s3.bucket=symbols"); err == nil || !strings.Contains(err.Error(), "s3.endpoint") {
		t.Errorf("bucket without endpoint: %v", err)
	}
}

// volume returns a workload's pod volume by name.
func volume(o obj, name string) map[string]any {
	for _, v := range list(o, "spec", "template", "spec", "volumes") {
		if str(v, "name") == name {
			return v.(map[string]any)
		}
	}
	return nil
}
