package resources_test

import (
	"io/fs"
	"weida.dev/connector/cmd/drivers"
	"weida.dev/connector/service"

	"weida.dev/connector/resources"
)

// These tests load resources with the program's real drivers, which import
// this package: they are external tests, and these names keep them
// readable.

type (
	Set        = resources.Set
	Document   = resources.Document
	FieldError = resources.FieldError
	Connector  = resources.Connector
	Position   = resources.Position
	SecretRef  = resources.SecretRef
	Secret     = resources.Secret
	Resolver   = resources.Resolver
	Route      = resources.Route
)

func protocols() []resources.Protocol {
	return service.Protocols(drivers.All())
}

// Loader is resources.Loader with the program's protocols.
type Loader struct{ FS fs.FS }

func (l Loader) Load(paths ...string) (*Set, error) {
	return resources.Loader{FS: l.FS, Protocols: protocols()}.Load(paths...)
}

func Errors(err error) []*FieldError { return resources.Errors(err) }

const (
	APIVersion       = resources.APIVersion
	Kind             = resources.Kind
	MaxRoutes        = resources.MaxRoutes
	maxMappingValues = resources.MaxMappingValues
	maxTokens        = resources.MaxTokens
	maxDocuments     = resources.MaxDocuments
)

func stripRoutePos(rs []Route) []Route { return resources.StripRoutePos(rs) }

type Credentials = resources.Credentials

var ErrSecret = resources.ErrSecret

func NewSecret(v string) Secret { return resources.NewSecret(v) }

const redacted = "[redacted]"

const MaxSecretBytes = resources.MaxSecretBytes
