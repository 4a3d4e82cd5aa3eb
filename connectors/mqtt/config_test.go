package mqtt

import (
	"crypto/tls"
	"log/slog"
	"strings"
	"testing"

	"weida.dev/connector/connectors"
	"weida.dev/connector/resources"
)

// TestConfigOfAddress: the driver takes the broker's address from the
// loaded resource's parsed fields, and names the broker by a URL built
// from them.
func TestConfigOfAddress(t *testing.T) {
	tlsCfg := &tls.Config{ServerName: "broker.example"}
	for _, tc := range []struct {
		name    string
		broker  resources.Broker
		tls     *tls.Config
		wantTLS bool
		wantURL string
	}{
		{"plain", resources.Broker{Host: "127.0.0.1", Port: 1883}, nil, false, "mqtt://127.0.0.1:1883"},
		{"tls", resources.Broker{Host: "broker.example", Port: 8883, TLS: resources.TLS{Enabled: true}}, tlsCfg, true, "mqtts://broker.example:8883"},
		{"tls without a built config", resources.Broker{Host: "::1", Port: 9883, TLS: resources.TLS{Enabled: true}}, nil, true, "mqtts://[::1]:9883"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.broker.ClientID = "c"
			tc.broker.Options = Options{QoS: 1}
			cfg := configOf(resources.BrokerConfig{Resource: &resources.Connector{Broker: tc.broker}, TLS: tc.tls, Logger: slog.New(slog.DiscardHandler)})
			if cfg.Host != tc.broker.Host || cfg.Port != tc.broker.Port {
				t.Errorf("address %s:%d, want %s:%d", cfg.Host, cfg.Port, tc.broker.Host, tc.broker.Port)
			}
			if (cfg.TLS != nil) != tc.wantTLS {
				t.Errorf("TLS %v, want TLS %v", cfg.TLS, tc.wantTLS)
			}
			if tc.tls != nil && cfg.TLS != tc.tls {
				t.Error("the TLS configuration built for the resource is not the one used")
			}
			ac, err := cfg.clientConfig(func(connectors.ConnState) {}, slog.New(slog.DiscardHandler), nil, nil)
			if err != nil {
				t.Fatal(err)
			}
			if len(ac.ServerUrls) != 1 || ac.ServerUrls[0].String() != tc.wantURL {
				t.Errorf("server URLs %v, want [%s]", ac.ServerUrls, tc.wantURL)
			}
		})
	}
}

// TestConfigDefaultPort: a zero Port is the scheme's default.
func TestConfigDefaultPort(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{Host: "h"}, "mqtt://h:1883"},
		{Config{Host: "h", TLS: &tls.Config{}}, "mqtts://h:8883"},
		{Config{Host: "h", Port: 2000, TLS: &tls.Config{}}, "mqtts://h:2000"},
	} {
		if got := tc.cfg.serverURL().String(); got != tc.want {
			t.Errorf("%+v: %s, want %s", tc.cfg, got, tc.want)
		}
	}
}

func TestConfigRefused(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{ClientID: "c"}, "host is required"},
		{Config{Host: "h", Port: 70000, ClientID: "c"}, "out of range"},
		{Config{Host: "h"}, "client id"},
	} {
		_, err := tc.cfg.clientConfig(func(connectors.ConnState) {}, slog.New(slog.DiscardHandler), nil, nil)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%+v: error %v, want one saying %q", tc.cfg, err, tc.want)
		}
	}
}
