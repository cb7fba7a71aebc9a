module github.com/vfnic/vfnic

go 1.26.0

require (
	github.com/gopacket/gopacket v1.7.7
	github.com/stretchr/testify v1.12.1
	golang.org/x/net v0.55.0
	golang.org/x/sys v0.49.0
)

require go.yaml.in/yaml/v3 v3.0.5 // indirect
