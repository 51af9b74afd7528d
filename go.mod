module github.com/autobyte/autobyte

go 1.26.0

require (
	github.com/spf13/cobra v1.10.2
	github.com/spf13/pflag v1.0.9
	golang.org/x/time v0.16.0
)

require github.com/inconshreveable/mousetrap v1.1.0 // indirect
