// Package semconvtest stands in for contrib's pkg/semconvtest, which the
// module proxy does not serve. Only k8sattributesprocessor's own tests
// import it, never the distribution, but the builder's `go mod tidy`
// resolves the imports of its dependencies' tests too; an empty package
// satisfies that (builder-config.yaml replaces the module with this one).
package semconvtest
