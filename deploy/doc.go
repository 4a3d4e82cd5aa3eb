// Package deploy holds what runs the connector outside a developer's shell:
// Kubernetes manifests (deploy/kubernetes, `kubectl apply -k
// deploy/kubernetes`) and a Grafana dashboard (deploy/grafana). It has no
// code of its own. Its tests hold the manifests and the dashboard to the
// binary they describe: every manifest decodes strictly into its real API
// type, the container's flags are flags `connector run` accepts, the
// resource files pass `connector check`, and every metric the dashboard
// queries is one the connector exports.
package deploy
