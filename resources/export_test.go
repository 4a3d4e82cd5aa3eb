package resources

// Internals the external tests check against.
const (
	MaxMappingValues = maxMappingValues
	MaxTokens        = maxTokens
	MaxDocuments     = maxDocuments
)

var StripRoutePos = stripRoutePos
