module vectorlb.local/gateway-api-tools

go 1.26.8

require sigs.k8s.io/gateway-api v1.4.1 // indirect
