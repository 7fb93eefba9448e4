package testenv

import (
	"fmt"

	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterctlv1 "sigs.k8s.io/cluster-api/cmd/clusterctl/api/v1alpha3"
)

// DeleteForMovePatch is the patch clusterctl move applies to each source
// object just before deleting it (addDeleteForMoveAnnotationPatch in
// cmd/clusterctl/client/cluster/mover.go): a JSON patch adding
// /metadata/annotations, which replaces all of the object's annotations
// with the delete-for-move marker. Tests that stand in for a move use it
// so that webhooks and controllers see what the real one sends.
func DeleteForMovePatch() client.Patch {
	return client.RawPatch(types.JSONPatchType, fmt.Appendf(nil,
		`[{"op": "add", "path":"/metadata/annotations", "value":{%q:""}}]`, clusterctlv1.DeleteForMoveAnnotation))
}
