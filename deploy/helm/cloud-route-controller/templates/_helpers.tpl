{{/* The chart's name, or nameOverride. */}}
{{- define "crc.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The objects' name: fullnameOverride, else the release name if it contains the name, else "<release>-<name>". */}}
{{- define "crc.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "crc.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The pod selector (Helm's pair). Immutable on a Deployment: see the chart README's upgrade notes. */}}
{{- define "crc.selectorLabels" -}}
app.kubernetes.io/name: {{ include "crc.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels on every object: the selector pair, what deploy/kustomization.yaml adds, and Helm's. */}}
{{- define "crc.labels" -}}
{{ include "crc.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: route-controller
app.kubernetes.io/part-of: cloud-route-controller
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end -}}

{{/* The Lease's name: leaderElection.resourceName, with "-dry-run" appended under dryRun so that a shadow never holds a writing release's Lease. */}}
{{- define "crc.leaseName" -}}
{{- if .Values.dryRun -}}
{{- printf "%s-dry-run" .Values.leaderElection.resourceName -}}
{{- else -}}
{{- .Values.leaderElection.resourceName -}}
{{- end -}}
{{- end -}}

{{/* The ServiceAccount the pods run as. */}}
{{- define "crc.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "crc.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name must name an existing ServiceAccount when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The credentials Secret's name, or "" when no credentials come from a Secret. */}}
{{- define "crc.secretName" -}}
{{- if .Values.credentials.create -}}
{{- printf "%s-credentials" (include "crc.fullname" .) -}}
{{- else -}}
{{- .Values.credentials.existingSecret -}}
{{- end -}}
{{- end -}}

{{/* Whether the ConfigMap (cloudConfig) is rendered: always, unless an existing Secret or ConfigMap alone holds the config. */}}
{{- define "crc.configMap" -}}
{{- if or (not (or .Values.cloudConfigSecret.existingSecret .Values.cloudConfigConfigMap.existingConfigMap)) .Values.cloudConfig -}}
true
{{- end -}}
{{- end -}}

{{/* Refuses values that would render a controller that cannot work, with a message saying why. */}}
{{- define "crc.validate" -}}
{{- $providers := list "aws" "openstack" "hcloud" "azure" "gce" "memory" -}}
{{- if not (has .Values.provider $providers) -}}
{{- fail (printf "provider must be one of %s, got %q" (join ", " $providers) (toString .Values.provider)) -}}
{{- end -}}
{{- if not .Values.clusterCIDRs -}}
{{- fail "clusterCIDRs must list the cluster's pod CIDR(s), e.g. [10.244.0.0/16]" -}}
{{- end -}}
{{- if gt (len .Values.clusterCIDRs) 2 -}}
{{- fail (printf "clusterCIDRs takes one CIDR, or one IPv4 and one IPv6 CIDR; got %d" (len .Values.clusterCIDRs)) -}}
{{- end -}}
{{- if hasKey .Values "replicas" -}}
{{- fail "replicas was renamed replicaCount, as in Helm's own charts" -}}
{{- end -}}
{{- if and (gt (int .Values.replicaCount) 1) (not .Values.leaderElection.enabled) -}}
{{- fail (printf "replicaCount is %d but leaderElection.enabled is false: several replicas without a Lease would all change routes" (int .Values.replicaCount)) -}}
{{- end -}}
{{- if and .Values.cloudConfigSecret.existingSecret .Values.cloudConfigConfigMap.existingConfigMap -}}
{{- fail "cloudConfigSecret.existingSecret and cloudConfigConfigMap.existingConfigMap both name the provider's own config file: set one" -}}
{{- end -}}
{{- if .Values.cloudConfigConfigMap.existingConfigMap -}}
{{- if not (regexMatch "^[-._a-zA-Z0-9]+$" (toString .Values.cloudConfigConfigMap.key)) -}}
{{- fail (printf "cloudConfigConfigMap.key must be a ConfigMap key (letters, digits, '-', '_', '.'); got %q" (toString .Values.cloudConfigConfigMap.key)) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.credentials.create .Values.credentials.existingSecret -}}
{{- fail "credentials: set either create: true (with data) or existingSecret, not both" -}}
{{- end -}}
{{- range .Values.credentials.env -}}
{{- if not (and .name .key) -}}
{{- fail (printf "every credentials.env entry needs a name (the variable) and a key (in the Secret); got %v" .) -}}
{{- end -}}
{{- end -}}
{{- if and .Values.credentials.create (not .Values.credentials.data) -}}
{{- fail "credentials.create is true but credentials.data is empty" -}}
{{- end -}}
{{- if and .Values.credentials.env (not (include "crc.secretName" .)) -}}
{{- fail "credentials.env names Secret keys but there is no Secret: set credentials.existingSecret, or create: true with data" -}}
{{- end -}}
{{- if .Values.cloudConfigSecret.existingSecret -}}
{{- if not (regexMatch "^[-._a-zA-Z0-9]+$" (toString .Values.cloudConfigSecret.key)) -}}
{{- fail (printf "cloudConfigSecret.key must be a Secret key (letters, digits, '-', '_', '.'), the file's name in /etc/cloud-route-controller-secret; got %q" (toString .Values.cloudConfigSecret.key)) -}}
{{- end -}}
{{- end -}}
{{- range $k, $_ := .Values.podLabels -}}
{{- if has $k (list "app.kubernetes.io/name" "app.kubernetes.io/instance") -}}
{{- fail (printf "podLabels must not set %q: it is part of the Deployment's pod selector" $k) -}}
{{- end -}}
{{- end -}}
{{- $names := list "POD_NAME" "POD_NAMESPACE" -}}
{{- range concat .Values.credentials.env .Values.extraEnv -}}
{{- if not .name -}}
{{- fail (printf "every extraEnv entry needs a name; got %v" .) -}}
{{- end -}}
{{- if has .name $names -}}
{{- fail (printf "the environment variable %s is set twice (credentials.env and extraEnv, or one the chart sets itself)" .name) -}}
{{- end -}}
{{- $names = append $names .name -}}
{{- end -}}
{{- $volumes := list "cloud-config" "cloud-config-secret" "cloud-config-configmap" "serving-cert" -}}
{{- range .Values.extraVolumes -}}
{{- if has .name $volumes -}}
{{- fail (printf "extraVolumes: the volume name %s is taken (the chart's own, or listed twice)" (toString .name)) -}}
{{- end -}}
{{- $volumes = append $volumes .name -}}
{{- end -}}
{{- range .Values.extraVolumeMounts -}}
{{- if not (has .name $volumes) -}}
{{- fail (printf "extraVolumeMounts mounts %s, which is no volume of the pod (add it to extraVolumes)" (toString .name)) -}}
{{- end -}}
{{- if hasPrefix "/etc/cloud-route-controller" (toString .mountPath) -}}
{{- fail (printf "extraVolumeMounts: %s would hide or shadow the cloud config mounted at /etc/cloud-route-controller(-secret)" (toString .mountPath)) -}}
{{- end -}}
{{- end -}}
{{- if .Values.credentials.create -}}
{{- range .Values.credentials.env -}}
{{- if not (hasKey $.Values.credentials.data .key) -}}
{{- fail (printf "credentials.env %s reads key %q, which credentials.data does not have" .name .key) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* --route-ip-families: routeIPFamilies when set, else the families of clusterCIDRs (a ":" makes a CIDR IPv6), IPv4 first. */}}
{{- define "crc.routeIPFamilies" -}}
{{- if .Values.routeIPFamilies -}}
{{- join "," .Values.routeIPFamilies -}}
{{- else -}}
{{- $families := list -}}
{{- range .Values.clusterCIDRs -}}
{{- $families = append $families (ternary "IPv6" "IPv4" (contains ":" .)) -}}
{{- end -}}
{{- $families = uniq $families -}}
{{- if and (has "IPv4" $families) (has "IPv6" $families) -}}
IPv4,IPv6
{{- else -}}
{{- join "," $families -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The flags of `plan` that make it compute what the Deployment's `run` does: the same cluster, CIDRs, families, Node selector, provider, cloud config and deletion grace. */}}
{{- define "crc.planFlags" -}}
--cluster-cidr={{ join "," .Values.clusterCIDRs }} --cluster-name={{ .Values.clusterName }}
{{- with .Values.routeNodeSelector }} {{ printf "--node-selector=%s" . | squote }}{{ end }} --route-ip-families={{ include "crc.routeIPFamilies" . }} --cloud-provider={{ .Values.provider }}
{{- with .Values.cloudConfigSecret.existingSecret }} --cloud-config=/etc/cloud-route-controller-secret/{{ $.Values.cloudConfigSecret.key }}{{ end }}
{{- with .Values.cloudConfigConfigMap.existingConfigMap }} --cloud-config=/etc/cloud-route-controller-configmap/{{ $.Values.cloudConfigConfigMap.key }}{{ end }}
{{- if include "crc.configMap" . }} --cloud-config=/etc/cloud-route-controller/cloud.yaml{{ end }} --max-route-deletions={{ .Values.maxRouteDeletions }}
{{- range .Values.extraArgs }}
{{- if or (hasPrefix "--route-deletion-grace=" .) (hasPrefix "--kube-api-qps=" .) (hasPrefix "--kube-api-burst=" .) }} {{ . | squote }}{{ end }}
{{- end }}
{{- end -}}
