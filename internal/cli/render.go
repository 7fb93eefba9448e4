package cli

import (
	"errors"
	"fmt"
	"io"

	"github.com/spf13/cobra"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/yaml"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/devplane"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/plane"
)

func (a *app) renderCommand() *cobra.Command {
	var cf clusterFlags
	cmd := &cobra.Command{
		Use:   "render",
		Short: "Print the cluster up would make as YAML, for a management cluster of your own",
		Args:  cobra.NoArgs,
		RunE:  func(*cobra.Command, []string) error { return a.render(cf) },
	}
	cf.bind(cmd.Flags(), true)
	return cmd
}

func (a *app) render(cf clusterFlags) error {
	choice, err := cf.choice()
	if err != nil {
		return err
	}
	var objs []runtime.Object
	if cf.standIn {
		demo, err := devplane.Demo(cf.demoOptions(choice))
		if err != nil {
			return err
		}
		for _, o := range demo {
			objs = append(objs, o)
		}
	} else {
		co, err := cf.clusterOptions(choice)
		if err != nil {
			return err
		}
		imgs, err := devplane.ImageVolumes(co)
		if err != nil {
			return err
		}
		switch {
		case co.HostEtcd && !co.EtcdFollowsCluster:
			return fmt.Errorf("--host-etcd: only the plane runs a cluster's etcd on the host; up and create cluster take it")
		case co.HostEtcd:
			// Applied without the plane, the cluster has nobody to run
			// its etcd on the host: the TCG default does not apply.
			co = co.TCGEtcdOnHost(false)
		}
		cluster, err := devplane.RenderCluster(co, devplane.ClusterVariables(co, imgs))
		if err != nil {
			return err
		}
		cni, err := devplane.CNIObjects(co)
		if err != nil {
			return err
		}
		for _, o := range cni {
			objs = append(objs, o)
		}
		for _, o := range cluster {
			objs = append(objs, o)
		}
	}
	scheme, err := plane.Scheme()
	if err != nil {
		return err
	}
	for _, obj := range objs {
		// Readable user-data: stringData instead of base64.
		if s, ok := obj.(*corev1.Secret); ok {
			s.StringData = map[string]string{}
			for k, v := range s.Data {
				s.StringData[k] = string(v)
			}
			s.Data = nil
		}
		if err := printYAML(a.out, scheme, obj); err != nil {
			return err
		}
	}
	return nil
}

func printYAML(w io.Writer, scheme *runtime.Scheme, obj runtime.Object) error {
	gvk, err := apiutil.GVKForObject(obj, scheme)
	if err != nil {
		return err
	}
	obj.GetObjectKind().SetGroupVersionKind(gvk)
	data, err := yaml.Marshal(obj)
	if err != nil {
		return errors.Join(fmt.Errorf("rendering %s", gvk.Kind), err)
	}
	fmt.Fprintf(w, "---\n%s", data)
	return nil
}
