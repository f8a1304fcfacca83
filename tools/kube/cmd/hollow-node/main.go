// Command hollow-node runs one simulated Kubernetes node: the real kubelet
// code (kubemark's hollow kubelet, with a fake container runtime and a fake
// cAdvisor) plus the kubelet's own Dynamic Resource Allocation manager, so
// that DRA kubelet plugins register under <root-dir>/plugins_registry and get
// NodePrepareResources / NodeUnprepareResources calls as on a real node; with
// --device-plugins-dir also the kubelet's own device manager, so that device
// plugins register and get ListAndWatch and Allocate calls as on a real node.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	cadvisorapi "github.com/google/cadvisor/info/v1"
	"github.com/spf13/cobra"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	utilfeature "k8s.io/apiserver/pkg/util/feature"
	clientset "k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/component-base/cli"
	cliflag "k8s.io/component-base/cli/flag"
	_ "k8s.io/component-base/metrics/prometheus/restclient" // client metrics
	_ "k8s.io/component-base/metrics/prometheus/version"    // version metric
	"k8s.io/component-base/version"
	"k8s.io/component-base/version/verflag"
	fakeremote "k8s.io/cri-client/pkg/fake"
	"k8s.io/klog/v2"
	kubeletoptions "k8s.io/kubernetes/cmd/kubelet/app/options"
	"k8s.io/kubernetes/pkg/features"
	kubeletconfig "k8s.io/kubernetes/pkg/kubelet/apis/config"
	cadvisortest "k8s.io/kubernetes/pkg/kubelet/cadvisor/testing"
	"k8s.io/kubernetes/pkg/kubelet/cm"
	"k8s.io/kubernetes/pkg/kubelet/cm/dra"
	"k8s.io/kubernetes/pkg/kubemark"
	utilflag "k8s.io/kubernetes/pkg/util/flag"
)

type nodeOptions struct {
	kubeconfig        string
	nodeName          string
	rootDir           string
	nodeIP            string
	address           string
	port              int
	healthzPort       int
	providerID        string
	nodeLabels        map[string]string
	taints            []v1.Taint
	extendedResources map[string]string
	devicePluginsDir  string
	cpu               string
	memory            string
	ephemeralStorage  string
	maxPods           int
	apiQPS            float32
	apiBurst          int
	featureGates      map[string]bool
}

func (o *nodeOptions) addFlags(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.StringVar(&o.kubeconfig, "kubeconfig", "", "kubeconfig of the node's identity (client certificate CN=system:node:<name>, O=system:nodes). Required.")
	fs.StringVar(&o.nodeName, "node-name", "", "Name of the Node object to register. Required.")
	fs.StringVar(&o.rootDir, "root-dir", "", "Kubelet root directory (plugins_registry/, plugins/, pods/, DRA checkpoint). Created if missing. Required.")
	fs.StringVar(&o.nodeIP, "node-ip", "", "InternalIP the node reports (the kubelet refuses loopback addresses). Default: the first non-loopback IPv4 address of this machine.")
	fs.StringVar(&o.address, "address", "127.0.0.1", "Address the kubelet API and healthz endpoints listen on.")
	fs.IntVar(&o.port, "kubelet-port", 0, "Kubelet API port; 0 picks a free port.")
	fs.IntVar(&o.healthzPort, "healthz-port", 0, "Port of the plain-HTTP /healthz endpoint (the kubelet's own health checks); 0 picks a free port.")
	fs.StringVar(&o.providerID, "provider-id", "", "spec.providerID of the node (default kubemark://<node-name>).")
	fs.Var(cliflag.NewMapStringString(&o.nodeLabels), "node-labels", "Labels to register the node with, k=v,k2=v2. The NodeRestriction admission plugin refuses most *.kubernetes.io/ keys.")
	fs.Var(utilflag.RegisterWithTaintsVar{Value: &o.taints}, "register-with-taints", "Taints to register the node with, key=value:Effect,...")
	fs.Var(cliflag.NewMapStringString(&o.extendedResources), "extended-resources", "Device-plugin style extended resources in the node's capacity, name=quantity,... (for example aws.amazon.com/neuron=16).")
	fs.StringVar(&o.devicePluginsDir, "device-plugins-dir", "", "Serve device plugins with the kubelet's own device manager, whose socket folder (/var/lib/kubelet/device-plugins on every kubelet) is this directory: the node runs in a private mount namespace with it bind-mounted there (needs root), and device plugins on the host register at <dir>/kubelet.sock. Their resources replace --extended-resources.")
	fs.StringVar(&o.cpu, "cpu", "4", "CPU capacity, whole cores.")
	fs.StringVar(&o.memory, "memory", "16Gi", "Memory capacity.")
	fs.StringVar(&o.ephemeralStorage, "ephemeral-storage", "100Gi", "Ephemeral storage capacity.")
	fs.IntVar(&o.maxPods, "max-pods", 110, "Pod capacity.")
	fs.Float32Var(&o.apiQPS, "kube-api-qps", 10, "QPS towards the API server.")
	fs.IntVar(&o.apiBurst, "kube-api-burst", 20, "Burst towards the API server.")
	fs.Var(cliflag.NewMapStringBool(&o.featureGates), "feature-gates", "Kubelet feature gates, A=true,B=false: any gate this release knows (an unknown one is refused at start).")
	verflag.AddFlags(fs)
}

func main() {
	o := &nodeOptions{nodeLabels: map[string]string{}, extendedResources: map[string]string{}, featureGates: map[string]bool{}}
	cmd := &cobra.Command{
		Use:   "hollow-node --kubeconfig FILE --node-name NAME --root-dir DIR [flags]",
		Short: "A simulated node running the real kubelet code with a fake container runtime and the kubelet's DRA manager.",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			verflag.PrintAndExitIfRequested()
			return run(cmd.Context(), o)
		},
	}
	o.addFlags(cmd)
	os.Exit(cli.Run(cmd))
}

// machine is the fake cAdvisor with the node's CPU and memory.
type machine struct {
	cadvisortest.Fake
	cores  int
	memory int64
}

func (m *machine) MachineInfo() (*cadvisorapi.MachineInfo, error) {
	return &cadvisorapi.MachineInfo{NumCores: m.cores, MemoryCapacity: uint64(m.memory),
		InstanceID: cadvisorapi.InstanceID(m.NodeName)}, nil
}

func freePort(address string) (int, error) {
	l, err := net.Listen("tcp", net.JoinHostPort(address, "0"))
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func parseQuantity(flag, value string) (resource.Quantity, error) {
	q, err := resource.ParseQuantity(value)
	if err != nil || q.Sign() <= 0 {
		return q, fmt.Errorf("--%s=%q: want a positive quantity", flag, value)
	}
	return q, nil
}

func run(ctx context.Context, o *nodeOptions) error {
	klog.InfoS("hollow-node starting", "version", version.Get().GitVersion, "node", o.nodeName)
	if o.kubeconfig == "" || o.nodeName == "" || o.rootDir == "" {
		return errors.New("--kubeconfig, --node-name and --root-dir are required")
	}
	if o.devicePluginsDir != "" {
		if len(o.extendedResources) > 0 {
			return errors.New("--extended-resources and --device-plugins-dir both set the node's extended resources: give one")
		}
		dir, err := filepath.Abs(o.devicePluginsDir)
		if err != nil {
			return err
		}
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return fmt.Errorf("--device-plugins-dir: %w", err)
		}
		if !inOwnMountNamespace(dir) {
			return reexecInMountNamespace(dir)
		}
		if err := bindDevicePluginDir(dir); err != nil {
			return fmt.Errorf("--device-plugins-dir: %w", err)
		}
	}
	if err := utilfeature.DefaultMutableFeatureGate.SetFromMap(o.featureGates); err != nil {
		return fmt.Errorf("--feature-gates: %w", err)
	}
	cpu, err := parseQuantity("cpu", o.cpu)
	if err != nil {
		return err
	}
	memory, err := parseQuantity("memory", o.memory)
	if err != nil {
		return err
	}
	storage, err := parseQuantity("ephemeral-storage", o.ephemeralStorage)
	if err != nil {
		return err
	}
	extended := v1.ResourceList{}
	for name, value := range o.extendedResources {
		q, err := parseQuantity("extended-resources "+name, value)
		if err != nil {
			return err
		}
		extended[v1.ResourceName(name)] = q
	}
	root, err := filepath.Abs(o.rootDir)
	if err != nil {
		return err
	}
	for _, p := range []*int{&o.port, &o.healthzPort} {
		if *p == 0 {
			if *p, err = freePort(o.address); err != nil {
				return fmt.Errorf("pick a free port on %s: %w", o.address, err)
			}
		}
	}

	restConfig, err := clientcmd.BuildConfigFromFlags("", o.kubeconfig)
	if err != nil {
		return fmt.Errorf("load --kubeconfig: %w", err)
	}
	restConfig.ContentType = "application/vnd.kubernetes.protobuf"
	restConfig.QPS, restConfig.Burst = o.apiQPS, o.apiBurst
	restConfig.UserAgent = "hollow-node/" + o.nodeName
	client, err := clientset.NewForConfig(restConfig)
	if err != nil {
		return err
	}

	flags, kcfg := hollowConfig(o, root)
	heartbeatConfig := *restConfig
	heartbeatConfig.QPS = -1
	heartbeatConfig.Timeout = min(kcfg.NodeStatusUpdateFrequency.Duration, time.Duration(kcfg.NodeLeaseDurationSeconds)*time.Second)
	heartbeatClient, err := clientset.NewForConfig(&heartbeatConfig)
	if err != nil {
		return err
	}

	var containerManager cm.ContainerManager = cm.NewStubContainerManagerWithDevicePluginResource(extended)
	managers := &draContainerManager{ContainerManager: containerManager, ephemeralStorage: storage}
	if utilfeature.DefaultFeatureGate.Enabled(features.DynamicResourceAllocation) {
		if managers.dra, err = dra.NewManager(klog.Background(), client, root); err != nil {
			return fmt.Errorf("DRA manager: %w", err)
		}
	}
	if o.devicePluginsDir != "" {
		if managers.devices, managers.topology, err = newDeviceManager(); err != nil {
			return fmt.Errorf("device manager: %w", err)
		}
	}
	if managers.dra != nil || managers.devices != nil {
		containerManager = managers
	}

	// The fake runtime's socket lives in the root directory when the path
	// fits a unix socket address, else in the temporary directory.
	socket := filepath.Join(root, "fake-runtime.sock")
	endpoint := "unix://" + socket
	if len(socket) > 100 {
		if endpoint, err = fakeremote.GenerateEndpoint(); err != nil {
			return err
		}
		socket = endpoint[len("unix://"):]
	}
	_ = os.Remove(socket)
	fakeRuntime := fakeremote.NewFakeRemoteRuntime()
	if err := fakeRuntime.Start(endpoint); err != nil {
		return fmt.Errorf("fake container runtime: %w", err)
	}
	runtimeService, err := connectRuntime(ctx, endpoint)
	if err != nil {
		return fmt.Errorf("connect to the fake container runtime: %w", err)
	}

	info, _ := json.Marshal(map[string]any{"nodeName": o.nodeName, "pid": os.Getpid(),
		"address": o.address, "port": o.port, "healthzPort": o.healthzPort})
	if err := os.WriteFile(filepath.Join(root, "hollow-node.json"), append(info, '\n'), 0o644); err != nil {
		return err
	}
	go serveHealthz(o)
	klog.InfoS("hollow-node listening", "node", o.nodeName, "rootDir", root,
		"address", o.address, "port", o.port, "healthzPort", o.healthzPort)

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	go func() {
		s := <-stop
		klog.InfoS("hollow-node stopping", "signal", s.String())
		fakeRuntime.Stop()
		_ = os.Remove(socket)
		klog.Flush()
		os.Exit(0)
	}()

	kubemark.NewHollowKubelet(flags, kcfg, client, heartbeatClient,
		&machine{Fake: cadvisortest.Fake{NodeName: o.nodeName}, cores: int(cpu.Value()), memory: memory.Value()},
		fakeRuntime.ImageService, runtimeService, containerManager).Run(ctx)
	return nil
}

// hollowConfig starts from kubemark's kubelet settings and moves every path
// into the root directory and every endpoint onto the chosen address/ports.
func hollowConfig(o *nodeOptions, root string) (*kubeletoptions.KubeletFlags, *kubeletconfig.KubeletConfiguration) {
	// kubemark creates a scratch root in the temporary directory; point
	// that at our root and remove it once the settings are read.
	prev, hadPrev := os.LookupEnv("TMPDIR")
	_ = os.MkdirAll(root, 0o750)
	_ = os.Setenv("TMPDIR", root)
	flags, kcfg := kubemark.GetHollowKubeletConfig(&kubemark.HollowKubeletOptions{
		NodeName:           o.nodeName,
		KubeletPort:        o.port,
		MaxPods:            o.maxPods,
		NodeLabels:         o.nodeLabels,
		RegisterWithTaints: o.taints,
	})
	if hadPrev {
		_ = os.Setenv("TMPDIR", prev)
	} else {
		_ = os.Unsetenv("TMPDIR")
	}
	_ = os.RemoveAll(flags.RootDirectory)

	flags.RootDirectory = root
	flags.NodeIP = o.nodeIP
	if flags.NodeIP == "" {
		flags.NodeIP = hostIP()
	}
	kcfg.StaticPodPath = filepath.Join(root, "static-pods")
	kcfg.PodLogsDir = filepath.Join(root, "pod-logs")
	for _, d := range []string{kcfg.StaticPodPath, kcfg.PodLogsDir} {
		_ = os.MkdirAll(d, 0o750)
	}
	kcfg.Address = o.address
	kcfg.ReadOnlyPort = 0
	kcfg.HealthzBindAddress = o.address
	kcfg.HealthzPort = int32(o.healthzPort)
	kcfg.FeatureGates = o.featureGates
	if o.providerID != "" {
		kcfg.ProviderID = o.providerID
	}
	return flags, kcfg
}

// hostIP is the first IPv4 address of an up, non-loopback interface, or ""
// (then the kubelet resolves the node's address itself).
func hostIP() string {
	ifaces, _ := net.Interfaces()
	for _, iface := range ifaces {
		if iface.Flags&net.FlagUp == 0 || iface.Flags&net.FlagLoopback != 0 {
			continue
		}
		addrs, _ := iface.Addrs()
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.To4() != nil && n.IP.IsGlobalUnicast() {
				return n.IP.String()
			}
		}
	}
	return ""
}

// serveHealthz answers /healthz on --healthz-port with the kubelet's own
// /healthz (sync loop and ping checks), which only its API port serves when
// the kubelet runs embedded like here.
func serveHealthz(o *nodeOptions) {
	upstream := "http://" + net.JoinHostPort(o.address, strconv.Itoa(o.port)) + "/healthz"
	client := &http.Client{Timeout: 5 * time.Second}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, r *http.Request) {
		resp, err := client.Get(upstream)
		if err != nil {
			http.Error(w, "kubelet not serving yet: "+err.Error(), http.StatusServiceUnavailable)
			return
		}
		defer resp.Body.Close()
		w.Header().Set("Content-Type", resp.Header.Get("Content-Type"))
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, resp.Body)
	})
	server := &http.Server{Addr: net.JoinHostPort(o.address, strconv.Itoa(o.healthzPort)), Handler: mux,
		ReadHeaderTimeout: 5 * time.Second}
	if err := server.ListenAndServe(); err != nil {
		klog.ErrorS(err, "healthz server stopped")
		klog.FlushAndExit(klog.ExitFlushTimeout, 1)
	}
}
