package cli

import (
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"chessd/client"
)

// DefaultServer is used when no flag, variable or file names one.
const DefaultServer = "http://localhost:8080/v1"

// conn holds the --server, --key and --config flags.
type conn struct{ server, key, config *string }

func connFlags(fs *flag.FlagSet) conn {
	return conn{
		server: fs.String("server", "", "the API's address (default $CHESSD_SERVER, the config file, or "+DefaultServer+")"),
		key:    fs.String("key", "", "API key (default $CHESSD_KEY or the config file)"),
		config: fs.String("config", "", "config file (default $CHESSD_CONFIG or ~/.config/chessd/client.json)"),
	}
}

// fileConfig is the config file: {"server": "...", "key": "..."}.
type fileConfig struct {
	Server string `json:"server"`
	Key    string `json:"key"`
}

// resolve picks the server and key: a flag first, then the environment (CHESSD_SERVER,
// CHESSD_KEY), then the config file, then the default server and no key.
func (c conn) resolve(getenv func(string) string) (server, key string, err error) {
	file, err := readConfig(*c.config, getenv)
	if err != nil {
		return "", "", err
	}
	server = first(*c.server, getenv("CHESSD_SERVER"), file.Server, DefaultServer)
	key = first(*c.key, getenv("CHESSD_KEY"), file.Key)
	return client.ServerURL(server), key, nil
}

// readConfig reads the config file named by the flag or $CHESSD_CONFIG (which must
// exist), else ~/.config/chessd/client.json ($XDG_CONFIG_HOME) when it exists.
func readConfig(flagPath string, getenv func(string) string) (fileConfig, error) {
	var cfg fileConfig
	path := first(flagPath, getenv("CHESSD_CONFIG"))
	mustExist := path != ""
	if path == "" {
		dir := getenv("XDG_CONFIG_HOME")
		if dir == "" {
			home := getenv("HOME")
			if home == "" {
				return cfg, nil
			}
			dir = filepath.Join(home, ".config")
		}
		path = filepath.Join(dir, "chessd", "client.json")
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) && !mustExist {
		return cfg, nil
	}
	if err != nil {
		return cfg, fmt.Errorf("config: %w", err)
	}
	if err := json.Unmarshal(b, &cfg); err != nil {
		return cfg, fmt.Errorf("config %s: %w", path, err)
	}
	return cfg, nil
}

func first(vals ...string) string {
	for _, v := range vals {
		if v != "" {
			return v
		}
	}
	return ""
}
