//go:build tools

// The commands built from this module (scripts/istio-echo.sh); this file only pins them.
package tools

import (
	_ "istio.io/istio/pkg/test/echo/cmd/client"
	_ "istio.io/istio/pkg/test/echo/cmd/server"
)
