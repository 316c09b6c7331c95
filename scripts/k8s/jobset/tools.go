//go:build tools

// Package tools makes sigs.k8s.io/jobset (its main package is the controller) a dependency of
// this module; scripts/k8s-cluster.sh builds it from here.
package tools

import _ "sigs.k8s.io/jobset"
