package main

import (
	"errors"
	"flag"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/yaml"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/devplane"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/plane"
)

func render(args []string) error {
	fs := flag.NewFlagSet("render", flag.ExitOnError)
	var cf clusterFlags
	cf.bind(fs)
	_ = fs.Parse(args)
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
		co := cf.clusterOptions(choice)
		imgs, err := devplane.ImageVolumes(co)
		if err != nil {
			return err
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
		if err := printYAML(scheme, obj); err != nil {
			return err
		}
	}
	return nil
}

func printYAML(scheme *runtime.Scheme, obj runtime.Object) error {
	gvk, err := apiutil.GVKForObject(obj, scheme)
	if err != nil {
		return err
	}
	obj.GetObjectKind().SetGroupVersionKind(gvk)
	data, err := yaml.Marshal(obj)
	if err != nil {
		return errors.Join(fmt.Errorf("rendering %s", gvk.Kind), err)
	}
	fmt.Printf("---\n%s", data)
	return nil
}
