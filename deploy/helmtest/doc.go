// Package helmtest holds the tests of the Helm chart in deploy/helm/profsym:
// helm lint, helm template with several sets of values, the rendered
// objects' fields, the values schema, and the rendered collector
// configurations checked by the otelcol-profsym distribution itself.
package helmtest
