// Package resources reads Connector resource files: the contract that
// configures each bridge between a foreign broker and a weida endpoint.
//
// [Loader.Load] reads files and directories, decodes every YAML document
// strictly (unknown fields, wrong types and duplicate keys are errors),
// validates it, binds it to its conversion [policy.Policy], converts every
// route's filter (a filter the policy refuses is an error), checks that the
// declared losses are exactly the conversion's, applies defaults, and then
// applies the rules that span resources (one endpoint path per resource,
// one MQTT client id per broker, one certificate per listen address...).
// It reports every problem of every file at once, as [*FieldError] values
// joined with [errors.Join], each with file, line, column, field path,
// value, rule and hint.
//
// What it returns for a valid resource is a [*Connector]: everything the
// runtime needs, defaults applied, with each [Route] in both grammars.
//
// The package names no broker protocol. The program passes its list of
// [Protocol]s ([Loader].Protocols): spec.protocol must name one, the
// broker URL is parsed once against that protocol's [URLRules], and the
// protocol decodes its own spec.broker.<protocol> block through a
// [BrokerBlock], with the same positioned diagnostics as the common fields.
// Its typed settings travel opaquely in [Broker].Options.
//
// Secrets are never part of a resource: credentials are [SecretRef]s to an
// environment variable or a file, which a [Resolver] reads when a connector
// starts. Loading reads no secret and opens no connection. A resolved
// [Secret] redacts itself wherever it is printed, logged or encoded.
//
// docs/RESOURCES.md documents every field.
package resources
