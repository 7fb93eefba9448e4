package plane

import (
	"context"
	"fmt"
	"strings"
	"time"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/util/sets"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// crdReadyTimeout bounds the wait for the API server to serve every
// installed CRD.
const crdReadyTimeout = time.Minute

// installCRDs creates the CRDs, or updates them when a plane that keeps
// its etcd data starts again, and returns once discovery lists every
// served version of each.
//
// Conversion webhooks are dropped: every object is stored and read at its
// CRD's storage version by the plane's controllers, and a conversion
// webhook the API server cannot reach would fail requests that need none.
func installCRDs(ctx context.Context, c client.Client, cfg *rest.Config, crds []*apiextensionsv1.CustomResourceDefinition) error {
	waitingFor := map[string]sets.Set[string]{}
	for _, crd := range crds {
		crd = crd.DeepCopy()
		crd.Spec.Conversion = nil
		if err := createOrUpdate(ctx, c, crd); err != nil {
			return fmt.Errorf("installing CRD %s: %w", crd.Name, err)
		}
		for _, v := range crd.Spec.Versions {
			if v.Served {
				gv := crd.Spec.Group + "/" + v.Name
				if waitingFor[gv] == nil {
					waitingFor[gv] = sets.New[string]()
				}
				waitingFor[gv].Insert(crd.Spec.Names.Plural)
			}
		}
	}
	dc, err := discovery.NewDiscoveryClientForConfig(cfg)
	if err != nil {
		return err
	}
	err = wait.PollUntilContextTimeout(ctx, pollInterval, crdReadyTimeout, true, func(ctx context.Context) (bool, error) {
		for gv, plurals := range waitingFor {
			list, err := dc.ServerResourcesForGroupVersion(gv)
			if err != nil {
				return false, nil //nolint:nilerr // not served yet
			}
			for _, r := range list.APIResources {
				plurals.Delete(r.Name)
			}
			if plurals.Len() > 0 {
				return false, nil
			}
			delete(waitingFor, gv)
		}
		return true, nil
	})
	if err != nil {
		return fmt.Errorf("the API server does not serve %v: %w", sets.List(sets.KeySet(waitingFor)), err)
	}
	return nil
}

// installWebhookConfigurations creates (or updates) the webhook
// configurations with every webhook calling https://hostPort at its
// service's path and trusting caBundle, as the provider's Service would
// be reached in a real installation.
func installWebhookConfigurations(ctx context.Context, c client.Client, configs []client.Object, hostPort string, caBundle []byte) error {
	for _, obj := range configs {
		obj = obj.DeepCopyObject().(client.Object)
		for _, cc := range webhookClientConfigs(obj) {
			cc.CABundle = caBundle
			if cc.Service != nil {
				cc.URL = ptr.To("https://" + hostPort + "/" + strings.TrimPrefix(ptr.Deref(cc.Service.Path, ""), "/"))
				cc.Service = nil
			}
		}
		if err := createOrUpdate(ctx, c, obj); err != nil {
			return fmt.Errorf("installing webhook configuration %s: %w", obj.GetName(), err)
		}
	}
	return nil
}

// webhookClientConfigs are the client configurations of a webhook
// configuration's webhooks, to change in place.
func webhookClientConfigs(obj client.Object) []*admissionv1.WebhookClientConfig {
	var out []*admissionv1.WebhookClientConfig
	switch wc := obj.(type) {
	case *admissionv1.MutatingWebhookConfiguration:
		for i := range wc.Webhooks {
			out = append(out, &wc.Webhooks[i].ClientConfig)
		}
	case *admissionv1.ValidatingWebhookConfiguration:
		for i := range wc.Webhooks {
			out = append(out, &wc.Webhooks[i].ClientConfig)
		}
	}
	return out
}

// createOrUpdate creates obj, or replaces the object of its name.
func createOrUpdate(ctx context.Context, c client.Client, obj client.Object) error {
	err := c.Create(ctx, obj)
	if !apierrors.IsAlreadyExists(err) {
		return err
	}
	existing := obj.DeepCopyObject().(client.Object)
	if err := c.Get(ctx, client.ObjectKeyFromObject(obj), existing); err != nil {
		return err
	}
	obj.SetResourceVersion(existing.GetResourceVersion())
	return c.Update(ctx, obj)
}
